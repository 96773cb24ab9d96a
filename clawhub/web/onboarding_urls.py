from django.urls import path

from clawhub.web import onboarding

urlpatterns = [
    path("onboarding/", onboarding.onboarding, name="onboarding"),
    path("onboarding/checklist/", onboarding.onboarding_checklist_fragment, name="onboarding_checklist"),
]
