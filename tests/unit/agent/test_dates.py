"""Dates as people write them, read as ISO dates by the routing rules; text that is no date stays."""

from __future__ import annotations

import pytest

from recallserve.serve.agent.dates import iso_dates


@pytest.mark.parametrize(("text", "expected"), [
    ("2025年7月1日到7月31日之间库存变了多少", "2025-07-01到2025-07-31之间库存变了多少"),
    ("2025年7月1日到31日", "2025-07-01到2025-07-31"),  # a bare day right after a date and a range word
    ("KT-17 从2025-09-01到10月31日库存变了多少", "KT-17 从2025-09-01到2025-10-31库存变了多少"),  # the ISO date's year
    ("stock from July 1 to July 31, 2025", "stock from 2025-07-01 to 2025-07-31"),
    ("1 May 2025 to 3 May 2025", "2025-05-01 to 2025-05-03"),
    ("the 1st of July 2025", "2025-07-01"),
    ("2025/7/1", "2025-07-01"),
    # no dates, or no year to give them: left as written
    ("between 1 March and 5 March", "between 1 March and 5 March"),
    ("2025年7月1日下单，从3号仓库到5号仓库", "2025-07-01下单，从3号仓库到5号仓库"),
    ("2025年7月1日发货，预计3-5日送达", "2025-07-01发货，预计3-5日送达"),
    ("Orders since 2025-07-01: these 2 may have shipped late", "Orders since 2025-07-01: these 2 may have shipped late"),
    ("From July 1 1500 units were sold", "From July 1 1500 units were sold"),  # 1500 is no year
    ("2月30日到3月1日, 2025年", "2月30日到3月1日, 2025年"),
])
def test_dates_are_rewritten_and_other_numbers_are_not(text: str, expected: str) -> None:
    assert iso_dates(text) == expected
