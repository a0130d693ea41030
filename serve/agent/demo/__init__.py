"""The demo customer-service world (manual, tickets, orders by batch, inventory) and its scenario."""

from recallserve.serve.agent.demo.questions import QUESTION_SETS, load_questions
from recallserve.serve.agent.demo.scenario import DEMO_QUESTION, DEMO_TENANT, demo_photo_data_url, load_demo_memories, demo_messages
from recallserve.serve.agent.demo.tools import DEMO_SCOPES, demo_tools
from recallserve.serve.agent.demo.world import DemoWorld, load_world_data

__all__ = [
    "DemoWorld",
    "load_world_data",
    "demo_tools",
    "DEMO_SCOPES",
    "DEMO_QUESTION",
    "DEMO_TENANT",
    "demo_photo_data_url",
    "load_demo_memories",
    "demo_messages",
    "QUESTION_SETS",
    "load_questions",
]
