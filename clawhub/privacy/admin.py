"""The user admin. It lives here rather than in accounts because deleting a user goes through the same service
as deleting one's own account (``user_delete``), which reaches every app that holds the user's data."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import BaseUserCreationForm, UserChangeForm

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record, user_insert
from clawhub.keys.services import keys_cached_invalidate
from clawhub.privacy.services import user_delete


class UserCreationForm(BaseUserCreationForm):
    class Meta:
        model = User
        fields = ("email",)
        field_classes = {"email": forms.EmailField}


class UserEditForm(UserChangeForm):
    class Meta:
        model = User
        fields = "__all__"


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    form = UserEditForm
    add_form = UserCreationForm
    ordering = ["email"]
    list_display = ["email", "display_name", "is_staff", "is_active", "email_verified_at", "date_joined"]
    list_filter = ["is_staff", "is_superuser", "is_active"]
    search_fields = ["email", "display_name"]
    readonly_fields = ["last_login", "date_joined"]
    fieldsets = [
        (None, {"fields": ["email", "password"]}),
        ("Profile", {"fields": ["display_name", "email_verified_at"]}),
        ("Permissions", {"fields": ["is_active", "is_staff", "is_superuser", "groups", "user_permissions"]}),
        ("Dates", {"fields": ["last_login", "date_joined"]}),
    ]
    add_fieldsets = [
        (None, {"classes": ["wide"], "fields": ["email", "password1", "password2"]}),
    ]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            audit_record(actor=request.user, action="user.admin_change", target=obj, subject_user=obj,
                         fields=sorted(form.changed_data))
            if "is_active" in form.changed_data:
                # A deactivated user's keys stop working (key_resolve): gateways must not serve them from
                # their cached lookups.
                keys_cached_invalidate(owner_id=obj.pk)
        else:
            # Through the service, so that an admin-made user gets their personal tenant like everyone else.
            user_insert(user=obj)
            audit_record(actor=request.user, action="user.admin_create", target=obj, subject_user=obj)

    # Deleting a user here goes through the same service as deleting one's own account: keys revoked, the
    # personal adapter's files and loaded copies removed, and never a group left without its owner.
    def has_delete_permission(self, request, obj=None):
        if obj is not None and _owns_shared_group(obj):
            return False
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request):
        deleted, model_count, _perms_needed, protected = super().get_deleted_objects(objs, request)
        # user_delete decides what may go (has_delete_permission above); the row rules of related admins (an
        # owner's membership may not be deleted on its own) do not apply when the whole account goes.
        return deleted, model_count, set(), protected

    def delete_model(self, request, obj):
        user_delete(user=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        kept = []
        for user in queryset:
            if _owns_shared_group(user):
                kept.append(user.email)
                continue
            user_delete(user=user, actor=request.user)
        if kept:
            self.message_user(request, "Not deleted, they own groups with other members (transfer first): "
                              + ", ".join(kept), level=messages.WARNING)


def _owns_shared_group(user: User) -> bool:
    from clawhub.groups.models import Membership, Role

    owned = Membership.objects.filter(user=user, role=Role.OWNER).values_list("group_id", flat=True)
    return Membership.objects.filter(group_id__in=owned).exclude(user=user).exists()
