"""REST API for a user's own conversations: sessions and their turns (read only for now)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import (
    conversation_settings_for,
    session_get_for_user,
    sessions_for_user,
    turn_request,
    turn_training_source,
    turns_for_session,
    turns_messages,
)
from clawhub.conversations.services import conversation_settings_update
from clawhub.core.api import LIMIT_OFFSET_PARAMETERS, LimitOffset, QueryChoiceField, page_of
from clawhub.tenants.access import TenantAccess, TenantApi


class SessionOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    external_id = serializers.CharField()
    inferred = serializers.BooleanField()
    model = serializers.CharField(source="tenant.model_id")
    key = serializers.IntegerField(source="key_id", allow_null=True)
    started_at = serializers.DateTimeField()
    last_activity_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)
    close_reason = serializers.CharField()
    turn_count = serializers.IntegerField()


class TurnOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    turn_type = serializers.CharField()
    request_id = serializers.CharField()
    route = serializers.CharField()
    api = serializers.ChoiceField(choices=Turn.Api.choices,
                                  help_text="The API the client spoke (messages, responses: served as chat).")
    model = serializers.CharField()
    # Which of the tenant's adapter versions answered ("t<tenant>-v<version>", or the base model).
    upstream_model = serializers.CharField()
    adapter_version_id = serializers.IntegerField(allow_null=True)
    status = serializers.CharField()
    http_status = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    request = serializers.SerializerMethodField()  # with the messages, rebuilt from what each turn added
    response = serializers.JSONField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    usage_estimated = serializers.BooleanField()
    latency_ms = serializers.FloatField(allow_null=True)
    ttft_ms = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    next_state = serializers.JSONField(allow_null=True)
    next_state_at = serializers.DateTimeField(allow_null=True)
    closed_without_next = serializers.BooleanField()
    ended = serializers.CharField()
    clamped_max_tokens = serializers.IntegerField(allow_null=True)
    link = serializers.CharField()
    parent_id = serializers.IntegerField(allow_null=True)
    regenerate_of_id = serializers.IntegerField(allow_null=True)
    training_source = serializers.SerializerMethodField()

    def get_request(self, turn) -> dict:
        return turn_request(turn=turn, messages=self.context.get("messages", {}).get(turn.pk))

    def get_training_source(self, turn) -> str:
        return turn_training_source(turn=turn)[0]


class SessionListOutputSerializer(SessionOutputSerializer):
    main_turns = serializers.IntegerField()
    side_turns = serializers.IntegerField()
    playground_turns = serializers.IntegerField()


class SessionDetailOutputSerializer(SessionOutputSerializer):
    turns = TurnOutputSerializer(many=True)


class SessionListApi(APIView):
    """GET /api/sessions/?type=main|side|playground&q=&key=&since=&until=&limit=&offset= — the caller's
    sessions, newest activity first: with a turn of that type, with a turn whose messages or reply contain
    ``q`` (any case), sent with that key, active between those days (both included)."""

    class InputSerializer(serializers.Serializer):
        type = QueryChoiceField(choices=Turn.Type.choices, required=False)
        q = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                  help_text="Words in a message or a reply, any case.")
        key = serializers.IntegerField(required=False, min_value=1, help_text="Sessions this key sent.")
        since = serializers.DateField(required=False, help_text="Active on or after this day.")
        until = serializers.DateField(required=False, help_text="Active on or before this day.")

    OutputSerializer = SessionListOutputSerializer

    class Pagination(LimitOffset):
        default_limit = 50
        max_limit = 200

    @extend_schema(operation_id="sessions_list", parameters=[InputSerializer, *LIMIT_OFFSET_PARAMETERS],
                   responses=page_of("SessionPage", OutputSerializer(many=True)))
    def get(self, request):
        filters = self.InputSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        chosen = filters.validated_data
        sessions = sessions_for_user(user=request.user, turn_type=chosen.get("type"),
                                     text=chosen.get("q", ""), key_id=chosen.get("key"),
                                     since=chosen.get("since"), until=chosen.get("until"))
        paginator = self.Pagination()
        page = paginator.paginate_queryset(sessions, request, view=self)
        return paginator.get_paginated_response(self.OutputSerializer(page, many=True).data)


class SessionDetailApi(APIView):
    """GET /api/sessions/<id>/?type=main|side — one of the caller's sessions with its turns in order."""

    class InputSerializer(serializers.Serializer):
        type = QueryChoiceField(choices=Turn.Type.choices, required=False)

    OutputSerializer = SessionOutputSerializer
    TurnSerializer = TurnOutputSerializer

    @extend_schema(parameters=[InputSerializer], responses=SessionDetailOutputSerializer)
    def get(self, request, session_id: int):
        filters = self.InputSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        session = session_get_for_user(user=request.user, session_id=session_id)
        turns = turns_for_session(session=session, turn_type=filters.validated_data.get("type"))
        turns = list(turns)
        turns_data = self.TurnSerializer(
            turns, many=True, context={"messages": turns_messages(turns=turns)}
        ).data
        return Response({**self.OutputSerializer(session).data, "turns": turns_data})


class ConversationSettingsApi(TenantApi):
    """GET/PATCH /api/conversations/tenants/<tenant_id>/settings/ — which cut turns a tenant judges. Replies
    cut by a client disconnect or an upstream error are never judged; ``include_length_turns`` brings back
    the ones that stopped at max_tokens (off by default)."""

    class InputSerializer(serializers.Serializer):
        include_length_turns = serializers.BooleanField()

        class Meta:
            ref_name = "ConversationSettingsInput"

    class OutputSerializer(serializers.Serializer):
        tenant_id = serializers.IntegerField()
        include_length_turns = serializers.BooleanField()

        class Meta:
            ref_name = "ConversationSettingsOutput"

    @extend_schema(operation_id="conversation_settings_get", responses={200: OutputSerializer})
    def get(self, request, access: TenantAccess):
        return Response(self.OutputSerializer(conversation_settings_for(tenant_id=access.tenant.pk)).data)

    @extend_schema(operation_id="conversation_settings_update", request=InputSerializer,
                   responses={200: OutputSerializer})
    def patch(self, request, access: TenantAccess):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = conversation_settings_update(access=access, **data.validated_data)
        return Response(self.OutputSerializer(row).data)
