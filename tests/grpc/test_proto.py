"""The checked-in generated code is what the .proto files produce, and the StreamWeave messages
are the StreamWeave RPC's definitions field for field."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from runwire.edge.proto.runwire.v1 import runwire_pb2 as pb

PROTO_ROOT = Path(__file__).parents[2] / "pipeline" / "edge" / "proto"


def test_checked_in_generated_code_matches_the_proto(tmp_path: Path) -> None:
    """scripts/gen-proto's output equals what is checked in (regenerate after editing the .proto)."""
    shutil.copytree(PROTO_ROOT, tmp_path / "proto")
    root = tmp_path / "proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}",
         str(root / "runwire" / "v1" / "runwire.proto")],
        check=True,
    )
    for name in ("runwire_pb2.py", "runwire_pb2.pyi"):
        generated = (root / "runwire" / "v1" / name).read_text()
        assert generated == (PROTO_ROOT / "runwire" / "v1" / name).read_text(), f"{name} is stale: run scripts/gen-proto"


def fields(message: type) -> list[tuple[str, int, str]]:
    descriptor = message.DESCRIPTOR  # type: ignore[attr-defined]
    kinds = {1: "double", 3: "int64", 5: "int32", 8: "bool", 9: "string", 11: "message", 14: "enum"}
    return [(f.name, f.number, kinds[f.type]) for f in descriptor.fields]


def test_streamweave_messages_match_the_streamweave_rpc_field_for_field() -> None:
    """StreamWeave RPC: WeaveRequest, WeaveProgress, ExecutionStage and ExecutionResult as defined."""
    assert fields(pb.WeaveRequest) == [("query", 1, "string"), ("session_id", 2, "string"), ("tools", 3, "string")]
    assert pb.WeaveRequest.DESCRIPTOR.fields_by_name["tools"].is_repeated
    assert fields(pb.WeaveProgress) == [
        ("stage", 1, "enum"), ("progress", 2, "int32"), ("message", 3, "string"),
        ("tool_name", 4, "string"), ("timestamp", 5, "int64"), ("partial_result", 6, "message"),
    ]
    assert [(f[0], f[2]) for f in fields(pb.ExecutionResult)] == [("type", "string"), ("data_json", "string")]
    assert [(v.name, v.number) for v in pb.ExecutionStage.DESCRIPTOR.values] == [
        ("EXECUTION_STAGE_UNSPECIFIED", 0), ("EXECUTION_STAGE_PATTERN_SELECTION", 1),
        ("EXECUTION_STAGE_SCHEMA_DISCOVERY", 2), ("EXECUTION_STAGE_LLM_GENERATION", 3),
        ("EXECUTION_STAGE_TOOL_EXECUTION", 4), ("EXECUTION_STAGE_GUARDRAIL_CHECK", 5),
        ("EXECUTION_STAGE_SELF_CORRECTION", 6), ("EXECUTION_STAGE_COMPLETED", 7),
        ("EXECUTION_STAGE_FAILED", 8),
    ]
    method = pb.DESCRIPTOR.services_by_name["Runwire"].methods_by_name["StreamWeave"]
    assert method.input_type is pb.WeaveRequest.DESCRIPTOR and method.output_type is pb.WeaveProgress.DESCRIPTOR
    assert method.server_streaming and not method.client_streaming
