"""The A2A request handler: the SDK's JSON-RPC dispatcher calls it, it talks to the inbox.

A message is accepted through `ChannelContext.accept` like any platform event (durable
before the answer, deduplicated on the caller's `messageId`, one turn at a time per
context); everything reported about a task is read back from the stored rows
(`channels.a2a.tasks`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from datetime import UTC

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import validate_history_length, validate_page_size

from app.channel import ChannelContext
from app.events import AGENT_MARK, ChatType, InboundEvent, SessionScope, TextPart, escape_key_component
from channels.a2a.push import PushNotifications
from channels.a2a.settings import A2ASettings
from channels.a2a.tasks import (
    KIND_CANCEL,
    KIND_MESSAGE,
    SETTLED,
    TERMINAL,
    build_task,
    cancel_external_id,
)

CALLER = "chatgate.a2a.caller"  # ServerCallContext.state key: the authenticated caller's name
AGENT = "chatgate.a2a.agent"  # ... and the agent its URL named (`AgentListing`), if any
_MAX_ID = 200
_POLL = 0.2
_PAGE_SIZE = 50  # ListTasks without a page size
_LIST_MAX = 1000  # ListTasks sees the caller's newest tasks up to this many


def caller_of(context: ServerCallContext) -> str:
    caller = context.state.get(CALLER)
    if not caller:  # the route refuses unauthenticated requests before this
        raise InvalidRequestError(message="no authenticated caller")
    return str(caller)


def agent_of(context: ServerCallContext) -> str | None:
    """The non-default agent the request's URL named (None: the gateway's default agent);
    refused when the agent names its users and the caller is not one of them."""
    agent = context.state.get(AGENT)
    if agent is None or agent.default:
        return None
    if agent.users and caller_of(context) not in agent.users:
        raise InvalidRequestError(message=f"this caller may not use the agent {agent.name!r}")
    return str(agent.name)


class ChatgateRequestHandler(RequestHandler):
    def __init__(self, settings: A2ASettings, context: ChannelContext, channel: str = "a2a") -> None:
        self.settings = settings
        self.context = context
        self.channel = channel
        self.push = PushNotifications(settings, context, channel)

    # --- reading tasks ----------------------------------------------------------------

    async def load(self, task_id: str, caller: str, history_length: int | None = None) -> Task | None:
        """The caller's task, or None: another caller's task is as unknown as a missing one."""
        if not task_id or len(task_id) > _MAX_ID:
            return None
        event = await self.context.events.status(task_id)
        if event is None:
            return None
        meta = event.metadata.get("a2a", {})
        if meta.get("caller") != caller or meta.get("kind") != KIND_MESSAGE:
            return None
        canceled = await self.context.events.find(cancel_external_id(task_id)) is not None
        return build_task(event, canceled=canceled, history_length=history_length)

    # --- sending ----------------------------------------------------------------------

    def _event(
        self,
        caller: str,
        context_id: str,
        external_id: str,
        text: str,
        meta: dict[str, str],
        agent: str | None = None,
    ) -> InboundEvent:
        return InboundEvent(
            channel=self.channel,
            agent=agent,
            chat_id=caller,
            sender_id=caller,
            thread_id=context_id,
            chat_type=ChatType.DIRECT,
            parts=(TextPart(text=text),),
            external_id=external_id,
            session_scope=SessionScope.THREAD,
            metadata={"a2a": {"caller": caller, "context_id": context_id, **meta}},
        )

    async def submit(self, message: Message, caller: str, agent: str | None = None) -> str:
        """Accept the message into the inbox; returns its task id (the event id)."""
        texts = [p.text for p in message.parts if p.WhichOneof("content") == "text"]
        if not texts:
            raise ContentTypeNotSupportedError(message="only text parts are understood here")
        text = "\n".join(texts)
        if not text.strip():
            raise InvalidParamsError(message="the message text is empty")
        if len(text) > self.settings.max_text_chars:
            raise InvalidParamsError(message=f"text is longer than {self.settings.max_text_chars} characters")
        if len(message.message_id) > _MAX_ID or len(message.context_id) > _MAX_ID:
            raise InvalidParamsError(message=f"messageId and contextId are at most {_MAX_ID} characters")
        # With a named agent its own: one message id sent to two agents is two messages.
        to = f"{escape_key_component(agent)}@" if agent else ""
        external_id = f"msg:{to}{escape_key_component(caller)}:{message.message_id}"
        seen = await self.context.events.find(external_id)
        if seen is not None:  # a retry of a message already accepted: the same task
            return seen
        context_id = message.context_id
        if message.task_id:
            earlier = await self.load(message.task_id, caller)
            if earlier is None:
                raise TaskNotFoundError(message=f"task {message.task_id} not found")
            if earlier.status.state in TERMINAL:
                raise UnsupportedOperationError(message=f"task {message.task_id} is in a terminal state")
            if context_id and context_id != earlier.context_id:
                raise InvalidParamsError(message="contextId differs from the task's context")
            context_id = earlier.context_id
        context_id = context_id or uuid.uuid4().hex
        event = self._event(
            caller,
            context_id,
            external_id,
            text,
            {"kind": KIND_MESSAGE, "message_id": message.message_id, "continues": message.task_id},
            agent,
        )
        if await self.context.events.count(event.session_key) >= self.settings.max_turns_per_context:
            raise InvalidRequestError(
                message=f"this context reached its cap of {self.settings.max_turns_per_context} messages; "
                "start a new contextId"
            )
        [result] = await self.context.accept([event])
        if result.skipped:
            raise InvalidRequestError(message="this caller is not allowed here")
        return result.event_id

    async def _submit_with_push(
        self, params: SendMessageRequest, caller: str, agent: str | None = None
    ) -> str:
        """Submit the message; a push config sent with it is checked first, stored after,
        and told `submitted` at once."""
        config = None
        if params.configuration.HasField("task_push_notification_config"):
            config = params.configuration.task_push_notification_config
            await self.push.check(config)
        task_id = await self.submit(params.message, caller, agent)
        if config is not None:
            task = await self._task(task_id, caller, 0)
            submitted = TaskStatusUpdateEvent(
                task_id=task.id,
                context_id=task.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED, timestamp=task.status.timestamp),
            )
            await self.push.store(task_id, caller, config, first=submitted)
        return task_id

    async def _task(self, task_id: str, caller: str, history_length: int | None = None) -> Task:
        task = await self.load(task_id, caller, history_length)
        if task is None:  # stored a moment ago; gone only if retention pruned it
            raise TaskNotFoundError(message=f"task {task_id} not found")
        return task

    @validate_request_params
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        caller = caller_of(context)
        validate_history_length(params.configuration)  # before anything is stored
        task_id = await self._submit_with_push(params, caller, agent_of(context))
        history = (
            params.configuration.history_length if params.configuration.HasField("history_length") else None
        )
        if not params.configuration.return_immediately:
            await self.context.wait_for_replies(task_id, self.settings.wait_max_seconds)
        return await self._task(task_id, caller, history)

    @validate_request_params
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = caller_of(context)
        task_id = await self._submit_with_push(params, caller, agent_of(context))
        async for event in self._follow(task_id, caller):
            yield event

    async def _follow(self, task_id: str, caller: str) -> AsyncGenerator[Event]:
        """The task, then each change of its state, its replies, and its last state."""
        task = await self._task(task_id, caller)
        yield task
        state = task.status.state
        sent = {a.artifact_id for a in task.artifacts}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.stream_max_seconds
        while state not in SETTLED and loop.time() < deadline:
            await self.context.wait_for_replies(task_id, min(_POLL, max(0.0, deadline - loop.time())))
            task = await self._task(task_id, caller)
            for artifact in task.artifacts:
                if artifact.artifact_id not in sent:
                    sent.add(artifact.artifact_id)
                    yield TaskArtifactUpdateEvent(
                        task_id=task.id, context_id=task.context_id, artifact=artifact, last_chunk=True
                    )
            if task.status.state != state:
                state = task.status.state
                yield TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)

    @validate_request_params
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = caller_of(context)
        if await self.load(params.id, caller) is None:
            raise TaskNotFoundError(message=f"task {params.id} not found")
        async for event in self._follow(params.id, caller):
            yield event

    # --- tasks ------------------------------------------------------------------------

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_history_length(params)  # a negative length is refused, not read as "all"
        history = params.history_length if params.HasField("history_length") else None
        return await self.load(params.id, caller_of(context), history)

    @validate_request_params
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        """A task still waiting for its turn is canceled in the inbox and never runs; a
        working one gets a `/stop` for its session (it stops the running turn). The task
        is canceled from then on. Finished tasks cannot be canceled."""
        caller = caller_of(context)
        task = await self.load(params.id, caller)
        if task is None:
            return None
        if task.status.state == TaskState.TASK_STATE_CANCELED:
            return task
        if task.status.state in TERMINAL:
            raise TaskNotCancelableError(message=f"task {params.id} is already finished")
        if task.status.state == TaskState.TASK_STATE_SUBMITTED and await self.context.events.cancel_pending(
            task.id
        ):
            return await self._task(task.id, caller)
        # Taken by a turn meanwhile (or working): stop the turn that runs it.
        stop = self._event(
            caller,
            task.context_id,
            cancel_external_id(task.id),
            "/stop",
            {"kind": KIND_CANCEL, "task_id": task.id},
        )
        await self.context.accept([stop])
        return await self._task(task.id, caller)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The caller's tasks (of the agent its URL names), newest first, a page at a time.

        Read from the inbox like every task, the newest `_LIST_MAX` of the caller at most;
        `page_token` is the row id of the previous page's last task. Filters: `context_id`,
        `status`, `status_timestamp_after` (the task's last change)."""
        caller = caller_of(context)
        agent = agent_of(context)
        validate_history_length(params)
        size = params.page_size if params.HasField("page_size") else _PAGE_SIZE
        validate_page_size(size)
        before: int | None = None
        if params.page_token:
            if not params.page_token.isdigit() or len(params.page_token) > 18:
                raise InvalidParamsError(message="page_token is not one this server gave")
            before = int(params.page_token)
        after = (
            params.status_timestamp_after.ToDatetime(tzinfo=UTC)
            if params.HasField("status_timestamp_after")
            else None
        )
        to = f"{AGENT_MARK}{escape_key_component(agent)}:" if agent else ""
        prefix = f"{self.channel}:{to}{escape_key_component(caller)}:"
        exact = prefix + escape_key_component(params.context_id) if params.context_id else None
        rows = await self.context.events.list_ids(
            exact or prefix, external_prefix="msg:", limit=_LIST_MAX, updated_after=after
        )
        history = params.history_length if params.HasField("history_length") else None
        found: list[tuple[int, str, Task | None]] = []
        for row_id, event_id, key in rows:
            if exact is not None and key != exact:
                continue  # another context whose id starts with this one
            task = None
            if params.status:  # the state is read from more than the inbox row: load
                task = await self.load(event_id, caller, history)
                if task is None or task.status.state != params.status:
                    continue
            found.append((row_id, event_id, task))
        remaining = [f for f in found if before is None or f[0] < before]
        page = remaining[:size]
        tasks = []
        for _row_id, event_id, loaded in page:
            task = loaded or await self.load(event_id, caller, history)
            if task is None:  # pruned meanwhile
                continue
            if not params.include_artifacts:
                task.ClearField("artifacts")
            tasks.append(task)
        more = len(remaining) > size
        return ListTasksResponse(
            tasks=tasks,
            next_page_token=str(page[-1][0]) if more else "",
            page_size=len(tasks),  # what this page holds (the specification's reading)
            total_size=len(found),
        )

    # --- push notifications (channels.a2a.push) ---------------------------------------

    async def status_event(self, task_id: str, caller: str) -> TaskStatusUpdateEvent | None:
        task = await self.load(task_id, caller, history_length=0)
        if task is None:
            return None
        return TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)

    async def _own_task(self, task_id: str, caller: str) -> Task:
        task = await self.load(task_id, caller, history_length=0)
        if task is None:
            raise TaskNotFoundError(message=f"task {task_id} not found")
        return task

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        caller = caller_of(context)
        await self.push.check(params)
        task = await self._own_task(params.task_id, caller)
        return await self.push.store(task.id, caller, params)

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        caller = caller_of(context)
        _ = self.push.records
        task = await self._own_task(params.task_id, caller)
        config = await self.push.get(task.id, params.id, caller)
        if config is None:
            raise TaskNotFoundError(message=f"no push config {params.id or task.id} for task {task.id}")
        return config

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        caller = caller_of(context)
        _ = self.push.records
        task = await self._own_task(params.task_id, caller)
        return ListTaskPushNotificationConfigsResponse(configs=await self.push.list(task.id, caller))

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        caller = caller_of(context)
        _ = self.push.records
        task = await self._own_task(params.task_id, caller)
        if not await self.push.remove(task.id, params.id, caller):
            raise TaskNotFoundError(message=f"no push config {params.id or task.id} for task {task.id}")

    # --- not offered --------------------------------------------------------------------

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError
