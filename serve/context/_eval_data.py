"""Synthetic but realistic customer-service conversations for the retention evaluation.

Each conversation has 59 finished turns plus the question at turn 60. At turns 1, 10, 30 and
50 the customer sends a burst of five short messages (chat customers type like that), each
planting one item: 8 constraints (a time, a budget, a deadline, a carrier, an address to avoid,
a ticket to quote, an allergy, an opt-out) and 12 facts (order id, amount and card, order date,
phone, model, account, tracking number, email, an agent's full titled name, postcode, a double
charge, a membership id). Every item carries *keys*: values that occur nowhere else in the
conversation, so "the item is still in the context" can be checked mechanically, verbatim or
as an entity (a masked phone counts through its masked form ``****0199``).

The other turns are filler of the kind a support chat has: shipping times, returns, app log-in
trouble, opening hours, product questions, with agent answers of two to five sentences and
some tool calls whose outputs never contain a planted key.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["PlantedItem", "Turn", "Conversation", "LanguagePack", "build_conversation", "draw_conversation", "normalise",
           "PLANT_TURNS", "TOOL_OUTPUTS"]

PLANT_TURNS = (1, 10, 30, 50)
N_TURNS = 60


@dataclass(frozen=True)
class PlantedItem:
    """One constraint or fact planted in the conversation.

    Attributes:
        kind: "constraint" or "fact" (what it is meant to be; the categoriser decides retention).
        text: the customer's message.
        keys: each key is a tuple of alternatives; the item is present when every key has one
            alternative in the context (after :func:`normalise`).
        question: what the customer asks about it at turn 60.
        turn: the turn it was planted at.
    """

    kind: str
    text: str
    keys: tuple[tuple[str, ...], ...]
    question: str
    turn: int = 0


@dataclass
class Turn:
    """One turn: the customer's message(s), optional tool call, the agent's reply."""

    number: int
    user: list[str]
    reply: str
    tool: tuple[str, str] | None = None  # (tool name, output)


@dataclass
class Conversation:
    """A 59-turn history, the planted items and the customer's name."""

    seed: int
    customer: str
    turns: list[Turn] = field(default_factory=list)
    items: list[PlantedItem] = field(default_factory=list)


# NOTE: currency signs and the mask star are kept so "$450" does not match "SP-450" and a masked
# "****0199" stays distinct from a plain "0199" inside another number. Han characters are kept so a
# Chinese key ("张总", "3500元") is checked as written (the Chinese conversations, _eval_data_zh).
_NORM = re.compile(r"[^a-z0-9*$\u00a3\u20ac\u00a5\uffe5\u3400-\u4dbf\u4e00-\u9fff]")


def normalise(text: str) -> str:
    """Lowercase, keep letters, digits, Han characters, ``*`` and currency signs: "10:30 AM" == "10:30am"."""
    return _NORM.sub("", text.lower())


_TITLES = ["Dr.", "Prof.", "Mrs.", "Mr.", "Ms.", "Capt."]
_FIRST = ["Amara", "Henrik", "Lucia", "Tomasz", "Yuki", "Fatima", "Oskar", "Ines", "Rafael", "Maeve", "Kwame", "Sunita"]
_LAST = ["Okafor-Reyes", "Lindqvist", "Bianchi-Moreau", "Wisniewski", "Tanabe", "Al-Hashimi", "Brandt",
         "Carvalho", "Delacroix", "O'Sullivan", "Mensah", "Raghunathan"]
_CARRIERS = ["DHL", "FedEx", "UPS", "Hermes", "DPD", "GLS", "Royal Mail", "Purolator"]
_STREETS = ["Kestrel Lane", "Wexford Row", "Larkspur Court", "Quayside Walk", "Thornbury Road", "Alder Mews"]
_CITIES = [("Leeds", "LS6 2QT"), ("Bristol", "BS8 4RJ"), ("Glasgow", "G12 8QQ"), ("Cardiff", "CF10 3NB"),
           ("York", "YO31 7EP"), ("Bath", "BA2 6LN")]
_MATERIALS = ["latex", "nickel", "lanolin", "beeswax"]
_COMPANIES = ["Brightline Marketing", "Corvid Data Partners", "Halcyon Lead Services", "Meridian Outreach Ltd"]
_PRODUCTS = [("espresso machine", "Ristretto"), ("robot vacuum", "Dustwise"), ("standing desk", "Elevate"),
             ("air purifier", "Clearbreath"), ("e-bike battery", "Voltride")]
_COLOURS = ["slate grey", "sage green", "burnt orange", "midnight blue"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_DOMAINS = ["oakmail.net", "quillpost.org", "fernbox.io", "tidewater.email"]
_PARTS = ["drip tray", "brush roll", "motor housing", "filter frame"]


def _plant_pool(rng: random.Random, customer: str) -> list[PlantedItem]:
    """The 8 constraints and 12 facts of one conversation, values drawn from ``rng``."""
    hour = rng.choice([9, 10, 11])
    minute = rng.choice([15, 30, 45])
    call_time = f"{hour}:{minute}am"
    budget = f"${rng.randint(3, 9)}{rng.randint(0, 9)}{rng.choice([0, 5])}"
    deadline = f"{rng.randint(11, 27)} {rng.choice(_MONTHS)}"
    good, bad = rng.sample(_CARRIERS, 2)
    office = f"{rng.randint(100, 480)} {rng.choice(_STREETS)}"
    ticket = f"CS-{rng.randint(100000, 999999)}"
    material = rng.choice(_MATERIALS)
    company = rng.choice(_COMPANIES)
    order = f"ORD-{rng.randint(1000000, 9999999)}"
    paid = f"${rng.randint(150, 990)}.{rng.randint(10, 99)}"
    card4 = f"{rng.randint(1000, 9999)}"
    month = rng.choice(_MONTHS)
    day = rng.randint(2, 28)
    placed = f"{month} {day}, 2026"
    phone_tail = f"{rng.randint(1000, 9999)}"
    phone = f"+44 7{rng.randint(100, 999)} {rng.randint(100, 999)} {phone_tail}"
    product, brand = rng.choice(_PRODUCTS)
    model = f"{brand[:2].upper()}-{rng.randint(1000, 9999)}X"
    colour = rng.choice(_COLOURS)
    account = f"{rng.randint(10_000_000, 99_999_999)}"
    tracking = f"1Z{rng.randint(100, 999)}AA{rng.randint(10**9, 10**10 - 1)}"
    local = customer.split()[1].lower()
    domain = rng.choice(_DOMAINS)
    email = f"{local}.{rng.randint(10, 99)}@{domain}"
    agent = f"{rng.choice(_TITLES)} {rng.choice(_FIRST)} {rng.choice(_LAST)}"
    agent_day = f"{rng.randint(2, 28)} {rng.choice(_MONTHS)}"
    city, postcode = rng.choice(_CITIES)
    house = f"{rng.randint(2, 98)} {rng.choice(_STREETS)}"
    double = f"${rng.randint(20, 140)}.{rng.randint(10, 99)}"
    member = f"GLD-{rng.randint(10000, 99999)}"
    serial = f"SN{rng.randint(10**7, 10**8 - 1)}"
    part = rng.choice(_PARTS)
    c = "constraint"
    f = "fact"
    return [
        PlantedItem(c, f"Please never call me before {call_time}, I work night shifts.", ((call_time,),),
                    "From what time in the morning may you call me?"),
        PlantedItem(c, f"My budget for a replacement is {budget} at most, don't offer me anything pricier.",
                    ((budget,),), "What was my budget for a replacement?"),
        PlantedItem(c, f"I need this sorted by {deadline}, that is a hard deadline for me.", ((deadline,),),
                    "By when did I say this has to be resolved?"),
        PlantedItem(c, f"Only use {good} for deliveries to me, never {bad}.", ((good,), (bad,)),
                    "Which courier should you use for my deliveries, and which not?"),
        PlantedItem(c, f"Don't send anything to my office at {office}, it gets lost there.", ((office,),),
                    "Which address did I say you must not send things to?"),
        PlantedItem(c, f"Always quote ticket {ticket} when you write to me about this.", ((ticket,),),
                    "Which ticket number should you quote when writing to me?"),
        PlantedItem(c, f"I'm allergic to {material}, so the replacement must not contain any.", ((material,),),
                    "What am I allergic to, for the replacement?"),
        PlantedItem(c, f"You must not share my details with {company}, I opted out of that.", ((company,),),
                    "Which company must my details not be shared with?"),
        PlantedItem(f, f"My order number is {order}.", ((order,),), "What is my order number?"),
        PlantedItem(f, f"I paid {paid} with my card ending {card4}.", ((paid,), (f"ending {card4}", f"****{card4}")),
                    "How much did I pay and with which card?"),
        PlantedItem(f, f"I placed the order on {placed}.", ((placed,),), "When did I place the order?"),
        PlantedItem(f, f"My phone number is {phone}.", ((f"****{phone_tail}", phone, f"ending {phone_tail}"),),
                    "What phone number do you have for me?"),
        PlantedItem(f, f"The {product} is the {colour} one, model {model}.", ((model,),),
                    "Which model is my product?"),
        PlantedItem(f, f"My account number is {account}.", ((f"****{account[-4:]}", account, f"ending {account[-4:]}"),),
                    "What is my account number?"),
        PlantedItem(f, f"The courier gave me tracking number {tracking}.", ((tracking,),),
                    "What tracking number did the courier give me?"),
        PlantedItem(f, f"My email is {email}.", ((domain,),), "Which email address should you use?"),
        PlantedItem(f, f"I already spoke to your colleague {agent} on {agent_day}.", ((agent,),),
                    "Which of your colleagues did I speak to before?"),
        PlantedItem(f, f"My delivery address is {house}, {city} {postcode}.", ((postcode,),),
                    "What is my delivery address?"),
        PlantedItem(f, f"I was charged twice, the second charge was {double}.", ((double,),),
                    "How much was the duplicate charge?"),
        PlantedItem(f, f"My membership id is {member}, and the broken part is the {part}, serial {serial}.",
                    ((member,), (serial,)), "What are my membership id and the serial of the broken part?"),
    ]


_FILLER_Q = [
    "How long does standard shipping usually take to my area?",
    "Can I change the delivery slot to the afternoon?",
    "Is there a way to see the status in the app? I can't log in right now.",
    "The app keeps saying my session expired, what should I do?",
    "What are your opening hours on weekends?",
    "Do you have the same model in a smaller size?",
    "How do returns work if the box was already opened?",
    "Can I get a paper invoice sent with the replacement?",
    "Is the warranty still valid if I bought it on sale?",
    "What does the blinking orange light on the unit mean?",
    "Could you check whether the spare parts are in stock?",
    "Will I get an email when the refund is processed?",
    "Can someone else sign for the parcel if I'm not home?",
    "Is express shipping available for replacements?",
    "How do I reset the device to factory settings?",
    "Why does the tracking page show no updates since Tuesday?",
    "Can I combine the refund with a store credit voucher?",
    "Does the replacement come with a new power adapter?",
    "Is it possible to pick the item up at a local store instead?",
    "How do I clean the filter without damaging it?",
    "Could you explain the difference between the two warranty plans?",
    "What happens if the courier can't find my building?",
    "Do I need to print a return label myself?",
    "Is there a discount for loyalty members on accessories?",
    "How long is the refund usually on hold?",
    "Can you resend the confirmation email? I can't find it.",
    "What is the weight of the package, roughly?",
    "Are there any known issues with the latest firmware update?",
]
_FILLER_A = [
    "Thanks for your patience while I look into this.",
    "Standard shipping normally takes three to five working days, depending on the region and the carrier's load.",
    "I've checked our system and there is nothing unusual on our side at the moment.",
    "Our weekend support team is available from morning until early evening, and the chat stays open for urgent cases.",
    "If the app shows that message, signing out completely and signing back in usually refreshes the session token.",
    "Returns are accepted within thirty days, and opened items are fine as long as all accessories are included.",
    "The warranty covers manufacturing defects regardless of whether the item was bought at a discount.",
    "A blinking light usually means the unit is waiting for a firmware step to finish, so it is best not to unplug it.",
    "I can request a paper invoice for you; it is printed at the warehouse and placed inside the parcel.",
    "Refunds are issued to the original payment method and typically appear within five to seven working days.",
    "Someone else can sign for the parcel as long as they are at the delivery address when the courier arrives.",
    "Express shipping is available for most replacements, although remote areas may take an extra day.",
    "To reset the device, hold the power button for ten seconds until the display flashes twice.",
    "Tracking pages sometimes pause while a parcel moves between depots, and they catch up once it is scanned again.",
    "Store pick-up is possible for items that are in stock at the chosen location; you will get a message when it is ready.",
    "Rinse the filter under lukewarm water and let it dry fully for a day before putting it back.",
    "The extended plan adds accidental damage cover, while the basic plan only covers defects.",
    "If the courier cannot find the building, they will call the contact number on the order or leave a card.",
    "You don't need a printer: the return label can be shown as a code at any drop-off point.",
    "Members get a small discount on accessories, applied automatically at checkout when you are signed in.",
    "Let me know if there is anything else I can help with in the meantime.",
    "I have added a note to your case so that my colleagues can see the full history.",
    "I understand this has been frustrating, and I appreciate you bearing with us.",
    "The latest firmware fixed a connectivity bug, and we have no open issues reported against it.",
    "I've gone through the notes from the previous contacts so that you don't have to repeat anything you already told us.",
    "Our logistics partner updates its systems overnight, so information in the morning is usually the most accurate.",
    "If anything changes on our side, you will receive an automatic notification by email and in the app.",
    "For safety reasons we ask customers not to open the housing themselves, as that can affect the warranty assessment.",
    "Replacement units are tested before dispatch, and each one comes with a fresh quality-control sticker on the base.",
    "I can also arrange a call-back from our technical team if you would like someone to walk you through the settings.",
    "Most customers find that a quick restart after the update solves the issue without any further steps.",
    "The case is currently marked as a priority, which means it is reviewed at least once every working day.",
    "Please keep the original packaging if you still have it, because it protects the unit best during the return.",
    "I have double-checked the order history and can confirm that everything you mentioned is reflected there.",
    "Once the warehouse confirms the dispatch, the tracking information usually becomes visible within a few hours.",
    "Accessories bought separately are not affected by the replacement and can be kept as they are.",
]
_FILLER_CONTEXT = [
    "I was hoping to get this done today if possible.",
    "My neighbour had a similar problem last month and it took ages.",
    "Sorry if I already asked this earlier, it has been a long day.",
    "I'm asking because the manual is a bit vague about it.",
    "The last time I contacted you the chat disconnected halfway.",
    "I just want to make sure I understand the process correctly.",
    "It's not urgent, just curious.",
    "My partner asked me to check this as well.",
]
TOOL_OUTPUTS = _TOOLS = [
    ("check_stock", '{{"sku": "SP-{n}", "warehouses": [{{"name": "north", "available": {k}, "restock_days": 3}}, '
     '{{"name": "south", "available": 0, "restock_days": 9}}], "substitutes": ["SP-{n}-B", "SP-{n}-C"], '
     '"last_sync": "2026-02-0{k}T04:00:00Z"}}'),
    ("shipping_estimate", '{{"service": "standard", "zone": {k}, "days_min": 3, "days_max": 5, "express": '
     '{{"available": true, "days_min": 1, "days_max": 2, "surcharge_eur": 9.9}}, "cutoff_local": "15:00", '
     '"holidays_considered": true}}'),
    ("refund_status", '{{"case": "RF-{n}", "state": "pending_review", "queue_position": {k}, "history": '
     '[{{"event": "created", "by": "system"}}, {{"event": "assigned", "by": "team-refunds"}}], "sla_hours": 72}}'),
    ("store_lookup", '{{"stores": [{{"id": "ST-{n}", "open": "09:00-18:00", "pickup_ready_hours": {k}}}, '
     '{{"id": "ST-{n}9", "open": "10:00-20:00", "pickup_ready_hours": 24}}], "radius_km": 15}}'),
]
_ACKS = [
    "Thank you, I've noted all of that on your case.",
    "Understood, I have added these details to your file.",
    "Thanks, that's all recorded now. Let me look into it.",
    "Got it, those details are saved on your case.",
]


def build_conversation(seed: int) -> Conversation:
    """A deterministic 59-turn conversation for ``seed`` (turn 60 is the evaluation question).

    Example:
        >>> conv = build_conversation(0)
        >>> len(conv.turns), len(conv.items), sorted({i.turn for i in conv.items})
        (59, 20, [1, 10, 30, 50])
    """
    return draw_conversation(seed, ENGLISH)


@dataclass(frozen=True)
class LanguagePack:
    """What a conversation of one language is drawn from (the plan of turns is the same for all).

    Attributes:
        customer: draws the customer's name.
        plant_pool: the 20 items of one conversation, given the customer's name.
        intro: the first message, ``{customer}`` filled in.
        questions, answers, context, acks: filler questions, agent sentences, lead-ins, acknowledgements.
        tools: (tool name, output template) pairs.
        joiner: between the sentences of a reply (" " in English, "" in Chinese).
    """

    customer: Callable[[random.Random], str]
    plant_pool: Callable[[random.Random, str], list[PlantedItem]]
    intro: str
    questions: Sequence[str]
    answers: Sequence[str]
    context: Sequence[str]
    acks: Sequence[str]
    tools: Sequence[tuple[str, str]]
    joiner: str = " "


def draw_conversation(seed: int, pack: LanguagePack) -> Conversation:
    """A deterministic 59-turn conversation of ``pack``'s language for ``seed``."""
    rng = random.Random(seed)
    for _attempt in range(100):
        conv = _draw(rng, pack)
        if _keys_unique(conv):
            conv.seed = seed
            return conv
    raise RuntimeError(f"seed {seed}: could not draw a conversation with unique keys")  # pragma: no cover


def _keys_unique(conv: Conversation) -> bool:
    """Every item's first key alternatives occur in no other text of the conversation."""
    texts = [t for turn in conv.turns for t in [*turn.user, turn.reply, *(turn.tool or ())]]
    for item in conv.items:
        others = normalise("\n".join(t for t in texts if t != item.text))
        if any(normalise(key[0]) in others for key in item.keys):
            return False
    return True


def _draw(rng: random.Random, pack: LanguagePack) -> Conversation:
    customer = pack.customer(rng)
    pool = pack.plant_pool(rng, customer)
    rng.shuffle(pool)
    conv = Conversation(seed=0, customer=customer)
    for turn in range(1, N_TURNS):
        if turn in PLANT_TURNS:
            batch = pool[PLANT_TURNS.index(turn) * 5 : PLANT_TURNS.index(turn) * 5 + 5]
            conv.items.extend(PlantedItem(i.kind, i.text, i.keys, i.question, turn) for i in batch)
            user = [i.text for i in batch]
            if turn == 1:
                user.insert(0, pack.intro.format(customer=customer))
            conv.turns.append(Turn(turn, user, rng.choice(pack.acks)))
            continue
        question = rng.choice(pack.questions)
        if rng.random() < 0.4:
            question = f"{rng.choice(pack.context)}{pack.joiner}{question}"
        # NOTE: 4-8 sentences: support agents' replies in chat logs run ~60-200 tokens.
        reply = pack.joiner.join(rng.sample(list(pack.answers), rng.randint(4, 8)))
        tool = None
        # NOTE: about one turn in five uses a tool, as in the support logs the seed describes.
        if rng.random() < 0.2:
            name, template = rng.choice(pack.tools)
            tool = (name, template.format(n=rng.randint(100, 999), k=rng.randint(1, 9)))
        conv.turns.append(Turn(turn, [question], reply, tool))
    return conv


ENGLISH = LanguagePack(
    customer=lambda rng: f"{rng.choice(_TITLES)} {rng.choice(_FIRST)} {rng.choice(_LAST)}",
    plant_pool=_plant_pool, intro="Hello, this is {customer}.", questions=_FILLER_Q, answers=_FILLER_A,
    context=_FILLER_CONTEXT, acks=_ACKS, tools=_TOOLS,
)
