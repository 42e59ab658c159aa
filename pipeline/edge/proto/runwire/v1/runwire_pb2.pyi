from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExecutionStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTION_STAGE_UNSPECIFIED: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_PATTERN_SELECTION: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_SCHEMA_DISCOVERY: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_LLM_GENERATION: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_TOOL_EXECUTION: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_GUARDRAIL_CHECK: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_SELF_CORRECTION: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_COMPLETED: _ClassVar[ExecutionStage]
    EXECUTION_STAGE_FAILED: _ClassVar[ExecutionStage]
EXECUTION_STAGE_UNSPECIFIED: ExecutionStage
EXECUTION_STAGE_PATTERN_SELECTION: ExecutionStage
EXECUTION_STAGE_SCHEMA_DISCOVERY: ExecutionStage
EXECUTION_STAGE_LLM_GENERATION: ExecutionStage
EXECUTION_STAGE_TOOL_EXECUTION: ExecutionStage
EXECUTION_STAGE_GUARDRAIL_CHECK: ExecutionStage
EXECUTION_STAGE_SELF_CORRECTION: ExecutionStage
EXECUTION_STAGE_COMPLETED: ExecutionStage
EXECUTION_STAGE_FAILED: ExecutionStage

class Event(_message.Message):
    __slots__ = ("id", "ts", "type", "run_id", "child_id", "seq", "payload", "span", "parent_id", "root_id", "tenant", "ext", "frames", "thread_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    EXT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    ts: str
    type: str
    run_id: str
    child_id: str
    seq: int
    payload: str
    span: Span
    parent_id: str
    root_id: str
    tenant: str
    ext: str
    frames: _containers.RepeatedScalarFieldContainer[str]
    thread_id: str
    def __init__(self, id: _Optional[str] = ..., ts: _Optional[str] = ..., type: _Optional[str] = ..., run_id: _Optional[str] = ..., child_id: _Optional[str] = ..., seq: _Optional[int] = ..., payload: _Optional[str] = ..., span: _Optional[_Union[Span, _Mapping]] = ..., parent_id: _Optional[str] = ..., root_id: _Optional[str] = ..., tenant: _Optional[str] = ..., ext: _Optional[str] = ..., frames: _Optional[_Iterable[str]] = ..., thread_id: _Optional[str] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("run_id", "after_seq", "live", "detail", "profile", "children", "format")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: int
    live: bool
    detail: str
    profile: str
    children: str
    format: str
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., live: _Optional[bool] = ..., detail: _Optional[str] = ..., profile: _Optional[str] = ..., children: _Optional[str] = ..., format: _Optional[str] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("run_id", "command", "args")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    command: str
    args: str
    def __init__(self, run_id: _Optional[str] = ..., command: _Optional[str] = ..., args: _Optional[str] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("id", "command")
    ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    id: str
    command: str
    def __init__(self, id: _Optional[str] = ..., command: _Optional[str] = ...) -> None: ...

class IngestError(_message.Message):
    __slots__ = ("index", "code", "message", "field")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    index: int
    code: str
    message: str
    field: str
    def __init__(self, index: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class IngestReply(_message.Message):
    __slots__ = ("accepted", "rejected")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: _containers.RepeatedCompositeFieldContainer[IngestError]
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[_Iterable[_Union[IngestError, _Mapping]]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("state", "since", "until", "limit", "tenant")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    state: str
    since: str
    until: str
    limit: int
    tenant: str
    def __init__(self, state: _Optional[str] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., limit: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "tenant", "parent_id", "root_id", "state", "terminal", "events", "last_seq", "input_tokens", "output_tokens", "dropped", "first_ts", "last_ts")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    FIRST_TS_FIELD_NUMBER: _ClassVar[int]
    LAST_TS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    parent_id: str
    root_id: str
    state: str
    terminal: bool
    events: int
    last_seq: int
    input_tokens: int
    output_tokens: int
    dropped: int
    first_ts: str
    last_ts: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., parent_id: _Optional[str] = ..., root_id: _Optional[str] = ..., state: _Optional[str] = ..., terminal: _Optional[bool] = ..., events: _Optional[int] = ..., last_seq: _Optional[int] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., dropped: _Optional[int] = ..., first_ts: _Optional[str] = ..., last_ts: _Optional[str] = ...) -> None: ...

class ListRunsReply(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunInfo]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunInfo, _Mapping]]] = ...) -> None: ...

class WeaveRequest(_message.Message):
    __slots__ = ("query", "session_id", "tools")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    query: str
    session_id: str
    tools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, query: _Optional[str] = ..., session_id: _Optional[str] = ..., tools: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecutionResult(_message.Message):
    __slots__ = ("type", "data_json")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    type: str
    data_json: str
    def __init__(self, type: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class WeaveProgress(_message.Message):
    __slots__ = ("stage", "progress", "message", "tool_name", "timestamp", "partial_result")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_RESULT_FIELD_NUMBER: _ClassVar[int]
    stage: ExecutionStage
    progress: int
    message: str
    tool_name: str
    timestamp: int
    partial_result: ExecutionResult
    def __init__(self, stage: _Optional[_Union[ExecutionStage, str]] = ..., progress: _Optional[int] = ..., message: _Optional[str] = ..., tool_name: _Optional[str] = ..., timestamp: _Optional[int] = ..., partial_result: _Optional[_Union[ExecutionResult, _Mapping]] = ...) -> None: ...
