"""Web forms. They check shape only (required, matching passwords); the rules live in the services."""

from django import forms
from django.contrib.auth.password_validation import password_validators_help_text_html


class _NewPasswordMixin:
    """Two new-password fields that must match; the service then applies the password validators."""

    def clean(self):
        data = super().clean()
        if data.get("new_password1") and data.get("new_password2") and \
                data["new_password1"] != data["new_password2"]:
            self.add_error("new_password2", "The two passwords do not match.")
        return data


def _new_password_fields() -> tuple[forms.CharField, forms.CharField]:
    return (
        forms.CharField(label="New password", strip=False, help_text=password_validators_help_text_html(),
                        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})),
        forms.CharField(label="New password again", strip=False,
                        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})),
    )


class SignupForm(_NewPasswordMixin, forms.Form):
    email = forms.EmailField(widget=forms.EmailInput(attrs={"autocomplete": "email", "autofocus": True}))
    display_name = forms.CharField(label="Name (optional)", max_length=150, required=False)
    new_password1, new_password2 = _new_password_fields()


class LoginForm(forms.Form):
    email = forms.EmailField(widget=forms.EmailInput(attrs={"autocomplete": "email", "autofocus": True}))
    password = forms.CharField(strip=False,
                               widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))


class SignedUpLoginForm(LoginForm):
    """The login form that answers a sign-up: the address filled in, the cursor in the password field."""

    def __init__(self, *, email: str):
        super().__init__(initial={"email": email})
        self.fields["email"].widget.attrs.pop("autofocus", None)
        self.fields["password"].widget.attrs["autofocus"] = True


class PasswordChangeForm(_NewPasswordMixin, forms.Form):
    old_password = forms.CharField(label="Current password", strip=False,
                                   widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))
    new_password1, new_password2 = _new_password_fields()


class SetPasswordForm(_NewPasswordMixin, forms.Form):
    new_password1, new_password2 = _new_password_fields()
    # Ticked by default: a reset often follows a suspected compromise, and a stolen key outlives a password.
    revoke_keys = forms.BooleanField(
        label="Also revoke all my API keys", required=False, initial=True,
        help_text="Every client using one of your keys stops working until you give it a new key.")


class EmailForm(forms.Form):
    email = forms.EmailField(widget=forms.EmailInput(attrs={"autocomplete": "email"}))


class DisplayNameForm(forms.Form):
    display_name = forms.CharField(label="Name", max_length=150, required=False,
                                   widget=forms.TextInput(attrs={"autocomplete": "name"}))
