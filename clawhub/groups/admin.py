"""Django admin for groups. Site staff use it to look and to fix; membership rules are the services' business,
so the admin shows memberships and invitations read-mostly and never shows or edits token digests."""

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet

from clawhub.groups.models import Group, Invitation, Membership, Role
from clawhub.groups.selectors import invitation_status
from clawhub.keys.services import keys_cached_invalidate


def _not_the_owner(membership: Membership | None) -> bool:
    # A group always has its owner: ownership moves by transfer, and the owner leaves with the whole group.
    return membership is None or membership.role != Role.OWNER


class MembershipInlineFormSet(BaseInlineFormSet):
    """The group page's member rows: the owner's row cannot be deleted, demoted or given to someone else here,
    and no row can be made an owner (ownership moves by transfer), so a group never loses its owner."""

    def clean(self):
        super().clean()
        for form in self.forms:
            was_owner = form.instance.pk is not None and form.initial.get("role") == Role.OWNER
            if was_owner and form in self.deleted_forms:
                raise ValidationError("The owner's membership cannot be deleted: transfer the ownership "
                                      "first.")
            if not form.has_changed() or form in self.deleted_forms:
                continue
            role = form.cleaned_data.get("role")
            if was_owner and (role != Role.OWNER or "user" in form.changed_data):
                raise ValidationError("The owner's membership cannot be changed here: transfer the "
                                      "ownership.")
            if not was_owner and role == Role.OWNER:
                raise ValidationError("Ownership moves by transfer, not by editing a membership.")


def _forget_keys_of(*rows: tuple[int | None, int | None]) -> None:
    """A membership row edited here (its role, user or group changed, or the row deleted) decides whether its
    user's keys bound to its group still work (key_resolve): gateways must look them up again. ``rows``:
    (user id, group id) as the row was and as it is."""
    for user_id, group_id in set(rows):
        if user_id is not None and group_id is not None:
            keys_cached_invalidate(owner_id=user_id, group_id=group_id)


def _as_it_was(form) -> tuple[int | None, int | None]:
    instance = form.instance
    return (form.initial.get("user", instance.user_id), form.initial.get("group", instance.group_id))


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = MembershipInlineFormSet
    extra = 0
    fields = ("user", "role", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "created_by", "created_at", "member_count")
    search_fields = ("name", "slug")
    readonly_fields = ("created_at", "created_by")
    inlines = [MembershipInline]

    @admin.display(description="members")
    def member_count(self, group: Group) -> int:
        return group.memberships.count()

    def save_formset(self, request, form, formset, change):
        edited = [row for row in formset.initial_forms if row.has_changed() or row in formset.deleted_forms]
        was = [_as_it_was(row) for row in edited]  # read before the save, which may delete the rows
        super().save_formset(request, form, formset, change)
        if formset.model is Membership:
            _forget_keys_of(*was, *((row.instance.user_id, row.instance.group_id) for row in edited))


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "group", "role", "created_at")
    list_filter = ("role",)
    search_fields = ("user__email", "group__slug", "group__name")
    raw_id_fields = ("user", "group")

    def has_delete_permission(self, request, obj=None):
        return _not_the_owner(obj) and super().has_delete_permission(request, obj)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change:
            _forget_keys_of(_as_it_was(form), (obj.user_id, obj.group_id))

    def delete_model(self, request, obj):
        row = (obj.user_id, obj.group_id)
        super().delete_model(request, obj)
        _forget_keys_of(row)

    def delete_queryset(self, request, queryset):
        kept = queryset.exclude(role=Role.OWNER)
        rows = list(kept.values_list("user_id", "group_id"))
        super().delete_queryset(request, kept)
        _forget_keys_of(*rows)


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ("id", "group", "email", "role", "status", "invited_by", "created_at", "expires_at")
    list_filter = ("role",)
    search_fields = ("email", "group__slug")
    # The digest is of no use to a person and only helps someone guessing tokens (never stored in clear).
    exclude = ("token_digest",)
    readonly_fields = ("group", "invited_by", "created_at", "accepted_by", "accepted_at", "declined_at")

    @admin.display(description="status")
    def status(self, invitation: Invitation) -> str:
        return invitation_status(invitation)

    def has_add_permission(self, request) -> bool:
        # Invitations carry a token that must reach someone; only invitation_create can make and deliver one.
        return False
