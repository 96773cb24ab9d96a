"""Forms for the key pages. They only parse input; the rules (roles, model ids, limits) are the services'."""

from django import forms
from django.conf import settings

from clawhub.keys.models import ApiKey
from clawhub.keys.scopes import MANAGEMENT_SCOPES, SCOPE_DESCRIPTIONS, Scope
from clawhub.keys.selectors import BASE_MODEL_ID, key_tenant, model_ids_for_tenant
from clawhub.tenants import naming


class _KeySettingsForm(forms.Form):
    name = forms.CharField(max_length=100)
    allowed_models = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple,
        help_text="Leave all unticked to allow every model this key's adapter offers.",
    )
    rpm_limit = forms.IntegerField(label="Requests per minute", min_value=1, required=False)
    tpm_limit = forms.IntegerField(label="Tokens per minute", min_value=1, required=False)
    concurrency_limit = forms.IntegerField(label="Concurrent requests", min_value=1, required=False)
    expires_at = forms.DateTimeField(
        label="Expires at (UTC)", required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    # inference is not a choice: every key has it. The rest is opt-in, so a leaked key does only /v1.
    scopes = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple,
        choices=[(s.value, f"{s.value}: {SCOPE_DESCRIPTIONS[s]}") for s in MANAGEMENT_SCOPES],
        help_text=f"Every key may use /v1 ({Scope.INFERENCE.value}). Tick more only for a script that "
                  "manages your account through the REST API: keys sit in plain files that agents read.",
    )


class KeyCreateForm(_KeySettingsForm):
    group = forms.ChoiceField(required=False, help_text="A group key trains the group's shared adapter.")

    field_order = ["name", "group", "allowed_models", "rpm_limit", "tpm_limit", "concurrency_limit",
                   "expires_at", "scopes"]

    def __init__(self, *args, groups, **kwargs):
        super().__init__(*args, **kwargs)
        # The site's default limits, shown filled in: clearing one is asking for no limit.
        for name, default in (("rpm_limit", settings.KEY_DEFAULT_RPM_LIMIT),
                              ("tpm_limit", settings.KEY_DEFAULT_TPM_LIMIT),
                              ("concurrency_limit", settings.KEY_DEFAULT_CONCURRENCY_LIMIT)):
            self.fields[name].initial = default
        self.fields["group"].choices = [("", "Personal (my own adapter)")] + [(g.slug, g.name)
                                                                               for g in groups]
        # Every id any of these tenants offers; the service checks that the chosen ones fit the chosen tenant.
        self.fields["allowed_models"].choices = (
            [(naming.PERSONAL_MODEL_ID, f"{naming.PERSONAL_MODEL_ID} (personal keys)")]
            + [(model_id, f"{model_id} ({g.name} keys)")
               for g in groups for model_id in [naming.group_model_id(g.slug)]]
            + [(BASE_MODEL_ID, "base (the shared base model)")]
        )


class KeyEditForm(_KeySettingsForm):
    def __init__(self, *args, key: ApiKey, **kwargs):
        kwargs.setdefault("initial", {
            "name": key.name, "allowed_models": key.allowed_models, "rpm_limit": key.rpm_limit,
            "tpm_limit": key.tpm_limit, "concurrency_limit": key.concurrency_limit,
            "expires_at": key.expires_at, "scopes": key.scopes,
        })
        super().__init__(*args, **kwargs)
        self.fields["allowed_models"].choices = [(m, m) for m in model_ids_for_tenant(key_tenant(key))]
