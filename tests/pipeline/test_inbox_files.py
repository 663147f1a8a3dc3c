"""Names of the files users send, as kept in a session's workspace: one harmless component."""

from __future__ import annotations

import base64

from app.agent.workspace import Workspace
from app.events import FilePart, ImagePart, InboundEvent, TextPart
from app.pipeline.inbox_files import MAX_NAME_CHARS, InboxFiles, safe_name


def test_safe_name_keeps_one_harmless_component() -> None:
    assert safe_name("../../etc/passwd", "file") == "passwd"
    assert safe_name("..\\..\\boot.ini", "file") == "boot.ini"
    assert safe_name(".env", "file") == "env"
    assert safe_name("..", "file") == "file"
    assert safe_name(None, "image.png") == "image.png"
    assert safe_name("报告 2026.pdf", "file") == "报告_2026.pdf"
    assert safe_name("a\x00b\nc.txt", "file") == "a_b_c.txt"
    long = safe_name("x" * 500 + ".xlsx", "file")
    assert len(long) == MAX_NAME_CHARS and long.endswith(".xlsx")


def test_paths_per_part_and_the_history_without_a_documents_bytes(tmp_path: object) -> None:
    data = base64.b64encode(b"%PDF").decode()
    event = InboundEvent(
        channel="telegram",
        chat_id="1",
        sender_id="1",
        external_id="update:9/../x",
        parts=(
            TextPart(text="two files"),
            FilePart(data_base64=data, name="a.pdf", mime_type="application/pdf"),
            FilePart(data_base64=data, name="a.pdf", mime_type="application/pdf"),
            ImagePart(data_base64=data, mime_type="image/png"),
            FilePart(url="https://example.com/ref.bin", name="ref.bin"),  # no bytes: not kept
        ),
    )
    files = InboxFiles(Workspace(str(tmp_path), per_session=True))
    assert files.paths(event) == {
        1: "inbox/update_9_x-a.pdf",
        2: "inbox/update_9_x-2-a.pdf",
        3: "inbox/update_9_x-image-3.png",
    }
    message = files.message(event)
    assert message.content == "two files"
    assert message.parts is not None
    kept = [(p.get("workspace_path"), p.get("data_base64") is not None) for p in message.parts]
    assert kept == [
        ("inbox/update_9_x-a.pdf", False),
        ("inbox/update_9_x-2-a.pdf", False),
        ("inbox/update_9_x-image-3.png", True),  # a vision model still sees the image
        (None, False),
    ]
    assert InboxFiles(None).paths(event) == {}
