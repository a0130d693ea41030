"""The console in a real browser (headless Chromium): sign in, every page, and tenancy.

Each test signs in through the page, works the page as an operator would, and checks what the
server holds afterwards through the API (a label really stored, a memory really deleted).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from recallserve.client import RecallServeError
from tests.console.conftest import ANSWER, ORDER_NOTE, SECRET, Console, shot, sign_in
from tests.unit.experience._records import speed_record


def test_a_wrong_key_is_said_in_plain_words_then_the_right_key_signs_in(page: Any) -> None:
    sign_in(page, "sk-wrong")
    banner = page.locator("#error")
    banner.wait_for(state="visible")
    assert "API key was not accepted" in banner.inner_text()
    assert page.locator("#signin-panel").is_visible() and not page.locator("#nav").is_visible()
    shot(page, "signin-error")
    sign_in(page, "sk-acme")
    page.wait_for_selector("#nav a.active")
    assert page.inner_text("#tenant") == "tenant acme"
    assert not page.locator("#error").is_visible()


def test_memory_search_shows_the_score_parts_opens_a_record_and_deletes_it(page: Any, console: Console) -> None:
    sign_in(page, "sk-acme")
    page.wait_for_selector("#memory-search")
    page.fill("#memory-search input[name=query]", "printer jams thermal fuse")
    page.check("#memory-search input[name=kind][value=text]")
    page.click("#memory-search button[type=submit]")
    row = page.locator(f'#memory-results tr[data-id="{console.memory_id}"]')
    row.wait_for()
    headers = page.locator("#memory-results th").all_inner_texts()
    assert {"score", "similarity", "time factor", "dense rank", "BM25 rank"} <= set(headers)
    cells = row.locator("td").all_inner_texts()
    assert float(cells[0]) > 0 and 0 < float(cells[2]) <= 1 and cells[3] != "—" and cells[4] != "—", cells
    row.click()
    assert page.inner_text("#memory-text") == SECRET
    assert "printers/jams" in page.inner_text("#memory-detail")
    shot(page, "memories")
    page.click("#memory-delete")
    page.click("#memory-delete")  # NOTE: the second click confirms
    page.wait_for_selector(f"text=Memory {console.memory_id} deleted.")
    with pytest.raises(RecallServeError) as gone:
        console.api().memories.get(console.memory_id)
    assert gone.value.status == 404
    assert page.locator(f'#memory-results tr[data-id="{console.memory_id}"]').count() == 0


def test_a_turns_trace_shows_route_tool_calls_memories_and_the_prompt(page: Any, console: Console) -> None:
    sign_in(page, "sk-acme")
    page.click("#nav a[data-page=turns]")
    page.click(f'#turn-list tr[data-id="{console.turn_id}"]')
    trace = page.locator("#turn-trace")
    trace.wait_for()
    text = trace.inner_text()
    assert "tools (decided by" in text and "order_status" in text
    calls = trace.locator("table", has=page.locator("th", has_text="arguments")).inner_text()
    # NOTE: the session's first turn ran the same call, so this one came from the tool cache
    assert '"order_id": "104208"' in calls and "\tcached\t" in calls and '"status": "delivered"' in calls
    assert page.inner_text("#turn-answer") == ANSWER
    memories = trace.locator("table", has=page.locator("th", has_text="time factor")).inner_text()
    assert ORDER_NOTE in memories and "ticket:T-2001" in memories and "[IBAN]" not in memories
    # the prompt as the model saw it, personal data masked
    assert "Question: Where is order 104208? Mail me at [EMAIL]" in text
    assert "jane.doe@example.com" not in page.content()
    shot(page, "turn-trace")


def test_sessions_show_mode_token_breakdown_summary_entities_and_last_context(page: Any, console: Console) -> None:
    sign_in(page, "sk-acme")
    page.click("#nav a[data-page=sessions]")
    page.click('#page tr[data-id="s-jane"]')
    detail = page.locator("#session-detail")
    detail.wait_for()
    text = detail.inner_text()
    assert "Session s-jane" in text and "messages\t4" in text.replace("\n", "\t"), text
    assert "Token breakdown" in text and "total" in text
    summary = console.api().sessions.get("s-jane", user="jane").summary.text
    assert summary and page.inner_text("#session-summary") == summary
    assert "Entity table" in text and "104208" in text  # the order id from the first turn
    assert "Context as the model received it" in text and "Question: Where is order 104208?" in text
    shot(page, "sessions")


def test_labelling_an_experience_moves_it_out_of_the_review_queue(page: Any, console: Console) -> None:
    sign_in(page, "sk-acme")
    page.click("#nav a[data-page=review]")
    page.select_option("#review-filter select[name=confidence]", "low")
    page.click("#review-filter button[type=submit]")
    page.click(f'#review-list tr[data-id="{console.experience_id}"]')
    page.check("#label-form input[value=wrong]")
    page.fill("#label-form input[name=tags]", "unit-error")
    page.fill("#label-form textarea[name=note]", "95 is not 120 / 1.5")
    shot(page, "review")
    page.click("#label-form button[type=submit]")
    result = page.locator("#label-result")
    result.wait_for()
    assert "Labelled wrong: moved to the archival cache" in result.inner_text()
    stored = console.api().experiences.get(console.experience_id)
    assert stored.tier == "archival"
    evaluation = stored.record.evaluation
    assert (evaluation.human_label, evaluation.review_note) == ("wrong", "95 is not 120 / 1.5")
    # NOTE: the reviewer's tag comes first; the verifier's own tags (its failed checks) are kept after it.
    assert evaluation.error_tags[0] == "unit-error"
    queue = console.api().experiences.review()
    assert console.experience_id not in [v.record.metadata.id for v in queue]


def test_review_queue_is_read_a_page_at_a_time(page: Any, console: Console) -> None:
    """51 records wait for initech's review: the page asks for 50, says there are more, and
    "Show 50 more" brings the 51st (issue 18: the page used to ask for 500 on every visit)."""
    for i in range(51):
        view = console.api("initech").experiences.create(
            speed_record(answer="95 km/h", text=f"A car drives 120 km in 1.5 h (case {i}). What is its speed?"))
        assert view.tier == "review", view
    asked: list[str] = []
    page.on("request", lambda req: asked.append(req.url) if "/v1/experiences/review" in req.url else None)
    sign_in(page, "sk-initech")
    page.click("#nav a[data-page=review]")
    page.wait_for_selector("#review-more")
    assert page.locator("#review-list tr.row").count() == 50
    assert "of the oldest 50 waiting for review (there are more)" in page.inner_text("#review-list")
    page.click("#review-more")
    page.locator("#review-list tr.row").nth(50).wait_for()  # NOTE: the console's CSP forbids wait_for_function's eval
    assert page.locator("#review-more").count() == 0 and "51 of 51 waiting for review." in page.inner_text("#review-list")
    assert [u.split("?", 1)[1] for u in asked] == ["limit=50", "limit=100"]


def test_health_shows_the_figures_from_the_metrics(page: Any, console: Console) -> None:
    sign_in(page, "sk-acme")
    page.click("#nav a[data-page=health]")
    cards = page.locator("#health-cards")
    cards.wait_for()
    text = cards.inner_text()
    for label in ("Request rate", "Server errors", "Latency p95", "Memory records", "Experience cache hit rate",
                  "Verification pass rate"):
        assert label in text, text
    rate = page.locator(".card", has_text="Request rate").locator(".value")
    deadline = time.monotonic() + 10
    while rate.inner_text() == "—":  # NOTE: the rate needs the second reading, 1 s after the first
        assert time.monotonic() < deadline, "no request rate after 10 s"
        time.sleep(0.1)
    assert rate.inner_text().endswith(" /s")
    # NOTE: an operator console route (no API model): the client's own httpx client, with its key.
    figures = console.api().http.get("/v1/console/health").json()
    assert figures["requests"] > 0 and figures["memory_records"] >= 1 and figures["verification_items"] > 0
    shot(page, "health")


def test_a_503_is_said_in_plain_words_not_a_blank_page(page: Any) -> None:
    page.route("**/v1/turns?*", lambda route: route.fulfill(
        status=503, content_type="application/json",
        body='{"error": {"message": "turns: the state store is unavailable (ActorDiedError); retry", '
             '"type": "service_unavailable", "param": null, "code": "state_unavailable"}}'))
    sign_in(page, "sk-acme")
    page.click("#nav a[data-page=turns]")
    banner = page.locator("#error")
    banner.wait_for(state="visible")
    assert "unavailable right now (503)" in banner.inner_text() and "state store" in banner.inner_text()
    assert page.locator("#turn-filter").is_visible()  # the page is still there


def test_a_second_tenant_sees_none_of_the_first_tenants_data(page: Any, console: Console) -> None:
    sign_in(page, "sk-globex")
    page.wait_for_selector("#memory-search")
    assert page.inner_text("#tenant") == "tenant globex"
    page.fill("#memory-search input[name=query]", "Where is order 104208? printer thermal fuse")
    page.click("#memory-search button[type=submit]")
    page.wait_for_selector("#memory-results p.note")
    seen = [page.content()]
    # NOTE: each page fetches its list after its heading is drawn (a hash change, no navigation, so
    # "networkidle" does not wait for it): wait for the empty list's own words before reading the page.
    for name, empty in (("sessions", "No traced session yet"), ("turns", "No traced turn yet."),
                        ("review", "Nothing to review.")):
        page.click(f"#nav a[data-page={name}]")
        page.wait_for_selector(f'#page[data-page="{name}"] h2')
        page.get_by_text(empty).first.wait_for()
        seen.append(page.content())
    page.goto(console.url + f"/console#turns")
    for leaked in (SECRET, ORDER_NOTE, console.memory_id, console.turn_id, console.experience_id, "s-jane", "104208", ANSWER):
        assert not any(leaked in html for html in seen), leaked


def test_the_erasures_page_lists_an_erasure_without_the_user_id(page: Any, console: Console) -> None:
    erasure = console.api("initech").users.erase("erase-me-user")
    sign_in(page, "sk-initech")
    page.wait_for_selector("#nav a.active")
    assert page.inner_text("#retention") == "retention: no limits"
    page.click("#nav a[data-page=erasures]")
    page.wait_for_selector('#page[data-page="erasures"] h2')
    page.get_by_text(erasure.id).wait_for()
    assert erasure.user_hash in page.content() and "erase-me-user" not in page.content()
    shot(page, "erasures")

