"""The demo scenario: a faulty BrewMaster photographed, "has this happened before, how was it fixed?".

The photo is drawn here (a machine panel whose display reads E42 and whose label names batch
B-2207), so no binary asset ships. OCR reads the label; retrieval with the question plus the
OCR text recalls the past E42 tickets of that batch; the model then checks the batch's orders
with a tool and answers citing the tickets.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from recallserve.serve.memory import MemoryBackend

__all__ = ["DEMO_QUESTION", "DEMO_TENANT", "SHARED_TENANT", "demo_photo_data_url", "load_demo_memories",
           "demo_messages"]

DEMO_TENANT = "demo-user"
# NOTE: company knowledge (manual, tickets) lives under memory_shards' shared tenant, visible to all.
SHARED_TENANT = "shared"
DEMO_QUESTION = (
    "My espresso machine shows this error, see the photo. Has this fault happened before, and how was it "
    "fixed? Which other orders come from the same batch?"
)
_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def _font(size: int) -> Any:
    from PIL import ImageFont

    for path in _FONTS:
        if Path(path).exists():
            return ImageFont.truetype(path, size)
    return ImageFont.load_default(size=size)


def demo_photo_data_url() -> str:
    """A PNG data URL: the front panel of a BrewMaster whose display reads E42, with its type label."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (900, 600), (54, 57, 62))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((60, 50, 840, 330), radius=24, fill=(30, 32, 36))  # panel
    d.rectangle((110, 90, 470, 290), fill=(12, 14, 12))  # display
    d.text((150, 120), "E42", font=_font(120), fill=(235, 40, 40))
    for i, x in enumerate((560, 660, 760)):  # buttons, the last one blinking red
        d.ellipse((x - 32, 160, x + 32, 224), fill=(200, 40, 40) if i == 2 else (150, 150, 150))
    d.rectangle((110, 380, 790, 560), fill=(245, 245, 240))  # type label
    d.text((135, 395), "BrewMaster 3000", font=_font(40), fill=(10, 10, 10))
    d.text((135, 450), "BATCH B-2207", font=_font(40), fill=(10, 10, 10))
    d.text((135, 505), "SN BM3-22071844   230V 1450W", font=_font(30), fill=(10, 10, 10))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


async def load_demo_memories(memory: MemoryBackend, tenant: str = SHARED_TENANT) -> list[str]:
    """Write the manual and the past tickets into ``memory`` (same source ids overwrite)."""
    from recallserve.serve.agent.demo.world import DemoWorld

    return await memory.write(tenant, DemoWorld().memories())


def demo_messages(question: str = DEMO_QUESTION, *, with_photo: bool = True) -> list[dict[str, Any]]:
    """The demo conversation as OpenAI messages (content parts: text + image_url data URL); run it with
    :func:`recallserve.serve.pipeline.agent_turn` (the HTTP path's turn building) and the agent."""
    content: list[dict[str, Any]] = [{"type": "text", "text": question}]
    if with_photo:
        content.append({"type": "image_url", "image_url": {"url": demo_photo_data_url()}})
    return [{"role": "user", "content": content}]
