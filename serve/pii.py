"""Personal data: the one masker, the per-tenant policy that applies it, and the log filter.

Every write path (chat write-back, ``POST /v1/memories``, experience records and the memories
they write, session messages, the entity table, rolling summaries) and every log line goes
through :func:`mask_pii` or :func:`apply_pii`, so what counts as personal data is decided here
only. Rules, applied in this order, each replaced by a tag so the text stays readable:

* secrets: ``password|passwd|pwd|passcode|passphrase|pin|pin code|security code|cvv|cvc|密码``
  followed by ``:``/``=``/``is``/``was`` and a value -> ``[PASSWORD]`` (the keyword stays);
* national ids: 18-character PRC resident ids (with a plausible birth date), US SSNs
  ``ddd-dd-dddd``, UK NI numbers ``AB123456C``, and any value after ``SSN``, ``ID card``,
  ``national id``, ``passport`` or ``身份证`` -> ``[ID_NUMBER]``;
* IBANs (mod-97 checked) -> ``[IBAN]``;
* card numbers: 13-19 digits, optionally grouped by spaces or dashes, passing the Luhn check
  -> ``[CARD_NUMBER]`` (the check keeps long order and tracking numbers readable);
* phone numbers: ``+`` country-code forms, PRC mobiles ``1[3-9]d{9}``, ``(ddd) ddd-dddd``,
  ``ddd-ddd-dddd`` (dots, dashes or spaces), trunk-prefixed ``0dd(d) ddd(d) dddd`` forms, and any
  number after ``phone|tel|mobile|cell|手机|电话`` -> ``[PHONE]``;
* e-mail addresses -> ``[EMAIL]``.

Ids the agent needs are not personal data and stay: 6-digit order ids (``104208``), ticket,
batch and loyalty ids (``T-88``, ``B-2207``, ``LC-448812``), dates and amounts.

The policy (``auth.pii`` per tenant, ``auth.default_pii`` otherwise) is ``mask`` (default),
``reject`` (a write holding personal data is a 400 naming the field) or ``allow`` (stored as
sent). Logs are masked whatever the policy: they are the operator's, not the tenant's.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "PiiMode",
    "PiiPolicy",
    "PersonalDataError",
    "MaskedValueError",
    "mask_pii",
    "mask_id",
    "SESSION_KEY_CHARS",
    "user_key",
    "apply_pii_id",
    "pii_kinds",
    "luhn_ok",
    "apply_pii",
    "for_write_back",
    "PiiLogFilter",
    "install_log_masking",
]

PiiMode = Literal["mask", "reject", "allow"]
Repl = Callable[[re.Match[str]], str]


def _keyed(words: str, value: str, zh_words: str, zh_value: str, *, sep_required: bool = False) -> re.Pattern[str]:
    """``keyword sep value`` (groups 1-3) or its Chinese form (groups 4-6); the value is what gets masked."""
    sep = r"(?:[:#=]|\bis\b|\bwas\b)" + ("" if sep_required else "?")
    return re.compile(rf"(?i)\b({words})(\s*{sep}\s*)({value})|({zh_words})(\s*[:：=是]?\s*)({zh_value})")


# NOTE: a secret needs its separator ("pin the message" is not a PIN); an id or phone after its
# keyword does not ("SSN 123456789").
_SECRET = _keyed(r"password|passwd|pwd|pass ?code|pass ?phrase|pin(?: code| number)?|security code|cvv2?|cvc",
                 r"\"[^\"]*\"|'[^']*'|[^\s,;]+", "密码", r"[^\s,;，。]+", sep_required=True)
_PRC_ID = re.compile(r"(?<![\dA-Za-z])\d{6}(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx](?![\dA-Za-z])")
_SSN = re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])")
_NINO = re.compile(r"\b[A-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
_ID_AFTER = _keyed(r"ssn|social security(?: number)?|id[ -]?card(?: number| no\.?)?|national id(?: number)?|"
                   r"passport(?: number| no\.?)?", r"[A-Z]{0,2}\d[\d -]{3,20}\d[A-Z]?\b",
                   r"身份证(?:号码?)?", r"[0-9Xx]{6,18}")
_IBAN = re.compile(r"(?i)\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")
# NOTE: a number right after a dash was never a card ("(?<![\d-])" keeps "order-104208 2024-01-15"
# from reading as one grouped 14-digit number), so "s-4111111111111111" (a session id, a reference)
# stayed in the clear everywhere: an ungrouped run of 13-19 digits after a dash is one (second branch).
_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])|(?<=-)\d{13,19}(?!\d)")
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}[\s.-]?(?:\(?\d{1,4}\)?[\s.-]?){2,4}\d{2,4}(?!\d)"  # +CC ...
    r"|(?<![A-Za-z0-9_])1[3-9]\d{9}(?![A-Za-z0-9])"  # PRC mobile (Han text may touch it; hex ids may not)
    r"|(?<![\d-])\(\d{3}\)\s?\d{3}[\s.-]\d{4}(?!\d)"  # (ddd) ddd-dddd
    r"|(?<![\d-])\d{3}[\s.-]\d{3}[\s.-]\d{4}(?![\d-])"  # ddd-ddd-dddd, ddd ddd dddd
    r"|(?<![\w-])0\d{2,4}[\s-]\d{3,4}[\s-]?\d{3,4}(?![\d-])"  # trunk 0: 020 7946 0958, 07700 900123
)
_PHONE_AFTER = _keyed(r"(?:phone|tel|telephone|mobile|cell|whatsapp)(?:\s+(?:number|no\.?))?",
                      r"\+?\d[\d\s().-]{5,18}\d", r"手机(?:号码?)?|电话(?:号码?)?", r"\+?\d[\d\s-]{5,18}\d")
# NOTE: bounded parts (RFC 5321's 64-character local part, RFC 1035's 63-character label): with "+"
# a run of word characters without an "@" (a long word, a digit run, base64) was tried from every
# position to its end and back, O(n^2): 40,000 "a"s took 10 s of one core, a 200,000-character chat
# message minutes, on every write and every masked log line. Now each start costs at most ~130 steps.
_EMAIL = re.compile(r"[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63})+")


def luhn_ok(digits: str) -> bool:
    """Luhn checksum of a digit string (card numbers pass, most random digit runs do not).

    Sum over digits from the right, doubling every second one (minus 9 when > 9); valid when the
    sum is divisible by 10.
    """
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _iban_ok(raw: str) -> bool:
    """ISO 13616 check: move the first four characters to the end, letters -> 10..35, mod 97 == 1."""
    s = re.sub(r"\s", "", raw).upper()
    if not 15 <= len(s) <= 34:
        return False
    return int("".join(str(int(c, 36)) for c in s[4:] + s[:4])) % 97 == 1


def _keep_key(tag: str) -> Repl:
    """Replacement keeping the keyword and separator (groups 1-2 or 4-5) and tagging the value."""

    def repl(m: re.Match[str]) -> str:
        if m.group(1):
            return f"{m.group(1)}{m.group(2)}{tag}"
        return f"{m.group(4)}{m.group(5)}{tag}"

    return repl


def _checked(tag: str, ok: Callable[[str], bool]) -> Repl:
    return lambda m: tag if ok(m.group(0)) else m.group(0)


def _card_ok(raw: str) -> bool:
    digits = re.sub(r"\D", "", raw)
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


# NOTE: order matters: keyword-anchored secrets and ids first (their values may look like
# anything), then checked numbers (IBAN before card: an IBAN's digits are not a card), phones
# last among numbers (the loosest digit patterns), e-mail independent.
_RULES: list[tuple[str, re.Pattern[str], str | Repl]] = [
    ("password", _SECRET, _keep_key("[PASSWORD]")),
    ("id_number", _ID_AFTER, _keep_key("[ID_NUMBER]")),
    ("id_number", _PRC_ID, "[ID_NUMBER]"),
    ("id_number", _SSN, "[ID_NUMBER]"),
    ("id_number", _NINO, "[ID_NUMBER]"),
    ("iban", _IBAN, _checked("[IBAN]", _iban_ok)),
    ("card_number", _CARD, _checked("[CARD_NUMBER]", _card_ok)),
    ("phone", _PHONE_AFTER, _keep_key("[PHONE]")),
    ("phone", _PHONE, "[PHONE]"),
    ("email", _EMAIL, "[EMAIL]"),
]


def mask_pii(text: str) -> str:
    """Replace personal data in ``text`` by tags (see the module docstring for the rules).

    Example:
        >>> mask_pii("call me at +1 415 555 0100, card 4111 1111 1111 1111, order 123456")
        'call me at [PHONE], card [CARD_NUMBER], order 123456'
    """
    if not text:
        return text
    for _, pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text


_ID_DIGEST_CHARS = 16
SESSION_KEY_CHARS = 128
"""NOTE: the session store's longest session id and user (serve.context): a masked one fits."""
# NOTE: the digest in letters only (hex 0-f -> a-p): no run of digits in it can look like a phone
# or card number to the masker, so a masked id masks to itself (a lookup by the stored key works).
_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")


def user_key(user: str, mode: PiiMode) -> str:
    """The key an end user's data is stored under: the request's ``user`` as sent under ``allow``,
    else :func:`mask_id` of it (an e-mail as the user id is stored masked, still distinct). Every
    store, the memory owner field, the erasure and the export use this one key.
    """
    return user if mode == "allow" else mask_id(user, SESSION_KEY_CHARS)


def mask_id(value: str, max_chars: int = 256) -> str:
    """An identifier (a memory's ``source_id``) with its personal data masked, kept distinct.

    A dedup key is compared, not read: masking two ids to the same ``[EMAIL]`` would make the
    second write replace the first (an acknowledged memory lost) and a lookup by the id the
    client holds find nothing. So the masked form carries a digest of the whole raw id: one raw
    id always masks to the same key (dedup and ``GET /v1/memories?source_id=`` work on it), two
    raw ids to two keys, and the raw personal data is not stored. An id without personal data,
    a masked one included, is returned as it is. The result is at most ``max_chars`` long.

    NOTE: the digest is unkeyed (stable across replicas and restarts without a shared secret):
    the id is pseudonymised, not anonymised; someone holding the store and a list of candidate
    addresses can test them.

    Example:
        >>> mask_id("order-104208"), mask_id("alice@example.com") != mask_id("bob@example.com")
        ('order-104208', True)
        >>> masked = mask_id("alice@example.com")
        >>> masked.startswith("[EMAIL]~"), mask_id(masked) == masked
        (True, True)
    """
    masked = mask_pii(value)
    if masked == value:
        return value
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=_ID_DIGEST_CHARS // 2,
                             person=b"recallserve.id").hexdigest().translate(_LETTERS)
    return f"{masked[: max(0, max_chars - len(digest) - 1)]}~{digest}"


def apply_pii_id(value: str, mode: PiiMode, param: str = "") -> str:
    """The policy applied to an identifier: ``reject`` as :func:`apply_pii`, ``mask`` by :func:`mask_id`."""
    if mode == "allow":
        return value
    if mode == "reject":
        return apply_pii(value, mode, param)
    return mask_id(value)


def pii_kinds(text: str) -> list[str]:
    """The kinds of personal data in ``text`` (empty when none), in rule order.

    Example:
        >>> pii_kinds("mail a@b.io, ticket T-88")
        ['email']
    """
    kinds: list[str] = []
    if not text:
        return kinds
    for kind, pattern, repl in _RULES:
        masked = pattern.sub(repl, text)
        if masked != text:
            text = masked
            if kind not in kinds:
                kinds.append(kind)
    return kinds


class PersonalDataError(ValueError):
    """A write holding personal data under the ``reject`` policy (the API answers 400).

    Attributes:
        param: the request field holding it, as the client wrote it (``memories.0.text``).
        kinds: what was found (``card_number``, ``phone``, ...).
    """

    def __init__(self, param: str, kinds: list[str]) -> None:
        self.param = param
        self.kinds = kinds
        super().__init__(f"{param}: contains personal data ({', '.join(kinds)}); this tenant's PII policy "
                         f"is 'reject': remove it, or ask the operator for the 'mask' policy")


class MaskedValueError(PersonalDataError):
    """A write whose value fits its field as sent but not once its personal data is masked (the API
    answers 400 naming the field, as for a rejected value).

    A tag can be longer than what it replaces (``pin:1`` -> ``pin:[PASSWORD]``, 2.8x) and is not
    every field's shape (an error tag ``123-45-6789`` -> ``[ID_NUMBER]``): re-validating the masked
    value raised pydantic's ValidationError, a 500, or (a label's ``model_copy``) stored a record
    that every later read failed on.
    """

    def __init__(self, param: str, why: str) -> None:
        self.param = param
        self.kinds = []
        ValueError.__init__(self, f"{param}: {why} once its personal data is masked; shorten it or send it "
                                  "without the personal data")

    @classmethod
    def from_validation(cls, errors: Sequence[Mapping[str, Any]], prefix: str = "") -> MaskedValueError:
        """The error naming the first field of ``errors`` (pydantic's ``ValidationError.errors()``)."""
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        why = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return cls(".".join(p for p in (prefix, loc) if p) or "body", why)


# NOTE: integers shorter than this cannot be a card, phone or id number (7+ digits), so the
# common small counts and ids are not stringified and scanned.
_MIN_SCANNED_INT = 10**6


def apply_pii(value: Any, mode: PiiMode, param: str = "") -> Any:
    """``value`` with the policy applied to every string (and long integer) inside it.

    Walks dicts (keys and values; a key masked as an id by :func:`mask_id`, so two keys stay two),
    lists and tuples; ``param`` is the path of ``value`` in the request, extended by keys and
    indexes so a rejection names the exact field. Under ``mask`` an integer holding personal data
    (a phone number sent as a JSON number) becomes its masked string.

    Raises:
        PersonalDataError: ``mode == "reject"`` and a string holds personal data.

    Example:
        >>> apply_pii({"note": "card 4111 1111 1111 1111"}, "mask")
        {'note': 'card [CARD_NUMBER]'}
    """
    if mode == "allow":
        return value
    if isinstance(value, str):
        kinds = pii_kinds(value)
        if not kinds:
            return value
        if mode == "reject":
            raise PersonalDataError(param or "body", kinds)
        return mask_pii(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _MIN_SCANNED_INT:
        masked = apply_pii(str(value), mode, param)
        return value if masked == str(value) else masked
    if isinstance(value, Mapping):
        # NOTE: a key is compared, not read (a metadata filter, a dict): masked as an id (mask_id),
        # distinct per raw key. Masked to the bare tag, {"a@x.io": 1, "b@y.io": 2} became one key
        # "[EMAIL]" and the write was acknowledged with one of the two values silently dropped.
        where = _join(param, "key")
        out = {apply_pii_id(k, mode, where) if isinstance(k, str) else apply_pii(k, mode, where):
               apply_pii(v, mode, _join(param, str(k))) for k, v in value.items()}
        if len(out) != len(value):
            raise MaskedValueError(param or "body", "two of its keys are the same key")
        return out
    if isinstance(value, (list, tuple)):
        return type(value)(apply_pii(v, mode, _join(param, str(i))) for i, v in enumerate(value))
    return value


def _join(param: str, part: str) -> str:
    return f"{param}.{part}" if param else part


def for_write_back(mode: PiiMode) -> PiiMode:
    """The policy of a write the server makes itself (chat write-back, a model's experience).

    ``reject`` becomes ``mask``: the client's input was already checked at the edge, and what the
    model or a tool added must not make an answered request fail afterwards.
    """
    return "allow" if mode == "allow" else "mask"


class PiiPolicy:
    """Tenant -> PII mode (``auth.pii``), with a default for the tenants it does not name.

    Example:
        >>> PiiPolicy({"lab": "allow"}).mode_for("lab"), PiiPolicy({}).mode_for("acme")
        ('allow', 'mask')
    """

    def __init__(self, modes: Mapping[str, PiiMode] | None = None, default: PiiMode = "mask") -> None:
        for tenant, mode in {**(modes or {}), "<default>": default}.items():
            if mode not in ("mask", "reject", "allow"):
                raise ValueError(f"pii[{tenant!r}]: expected mask, reject or allow, got {mode!r}")
        self._modes = dict(modes or {})
        self.default = default

    def mode_for(self, tenant: str) -> PiiMode:
        """The mode of ``tenant``."""
        return self._modes.get(tenant, self.default)


class PiiLogFilter(logging.Filter):
    """Masks personal data in a log record's message and traceback (always passes the record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's problem; leave it as is
            return True
        record.msg, record.args = mask_pii(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_pii(logging.Formatter().formatException(record.exc_info))
        return True


def install_log_masking() -> None:
    """Run :class:`PiiLogFilter` on every log record this process creates (idempotent).

    A filter on a logger misses its children and a filter on a handler misses handlers added
    later (Ray's, uvicorn's); the record factory sees every record once, at creation.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_recallserve_pii", False):
        return
    masker = PiiLogFilter()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        masker.filter(record)
        return record

    factory._recallserve_pii = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
