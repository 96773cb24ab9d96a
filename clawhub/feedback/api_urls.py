from django.urls import path

from clawhub.feedback import api
from clawhub.groups.api import one_url

_rules = one_url(api.JudgeRulesDetailApi, api.JudgeRulesUpdateApi).as_view()

urlpatterns = [
    path("judge-rules/", _rules, name="api-judge-rules"),
    path("groups/<slug:slug>/judge-rules/", _rules, name="api-group-judge-rules"),
]
