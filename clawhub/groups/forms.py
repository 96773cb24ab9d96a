from django import forms

from clawhub.groups.models import Group, Role


class GroupCreateForm(forms.Form):
    name = forms.CharField(max_length=Group._meta.get_field("name").max_length)
    slug = forms.CharField(
        max_length=60, required=False,
        help_text="Used in URLs and in the model id clawhub-group-<slug>; derived from the name if empty. "
                  "It cannot be changed later.",
    )


class GroupRenameForm(forms.Form):
    name = forms.CharField(max_length=Group._meta.get_field("name").max_length)


class InvitationForm(forms.Form):
    email = forms.EmailField(required=False,
                             help_text="Leave empty to create a link anyone holding it can use once.")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TransferForm(forms.Form):
    user_id = forms.IntegerField()
