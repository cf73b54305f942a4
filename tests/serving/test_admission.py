"""Admission control's arithmetic, on a clock the test moves: what is admitted, what is
refused with which retry time, and that a refusal takes nothing."""

from __future__ import annotations

import os
import time

import pytest

from inferwatch.serving.admission import (
    Admission,
    Limits,
    Policy,
    PolicyError,
    PolicyFile,
    Rejection,
    Ticket,
    parse_policy,
)
from tests.support.clock import Clock


def admission(policy: Policy) -> tuple[Admission, Clock]:
    clock = Clock()
    return Admission(policy, clock=clock), clock


def test_requests_per_minute_refill_continuously_and_say_when_to_return():
    adm, clock = admission(Policy(default_key=Limits(requests_per_minute=60)))
    assert all(isinstance(adm.admit("a", "m"), Ticket) for _ in range(60))
    refused = adm.admit("a", "m")
    assert isinstance(refused, Rejection) and (refused.scope, refused.limit) == ("key", "requests_per_minute")
    assert refused.retry_after_s == pytest.approx(1.0)
    clock.now += 0.5
    assert isinstance(adm.admit("a", "m"), Rejection)
    clock.now += 0.5
    assert isinstance(adm.admit("a", "m"), Ticket)
    clock.now += 3600  # a quiet hour saves up one minute's allowance, not sixty
    assert sum(isinstance(adm.admit("a", "m"), Ticket) for _ in range(100)) == 60


def test_each_key_has_its_own_allowance_and_a_model_limit_is_shared():
    adm, _ = admission(Policy(default_key=Limits(requests_per_minute=2),
                              models={"m": Limits(requests_per_minute=3)}))
    assert [isinstance(adm.admit(k, "m"), Ticket) for k in ("a", "a", "a", "b", "b")] == [True, True, False, True,
                                                                                         False]
    refused = adm.admit("c", "m")
    assert isinstance(refused, Rejection) and refused.scope == "model"
    assert isinstance(adm.admit("c", "other-model"), Ticket)


def test_in_flight_cap_until_a_request_ends():
    adm, _ = admission(Policy(default_model=Limits(max_in_flight=2)))
    first, second = adm.admit("a", "m"), adm.admit("b", "m")
    refused = adm.admit("c", "m")
    assert isinstance(refused, Rejection) and refused.limit == "in_flight" and "limit is 2" in refused.message
    adm.release(first, tokens=0)
    assert isinstance(adm.admit("c", "m"), Ticket)
    assert isinstance(second, Ticket)


def test_a_refusal_takes_nothing_from_the_limits_that_admitted():
    adm, _ = admission(Policy(default_key=Limits(requests_per_minute=5, max_in_flight=5),
                              default_model=Limits(max_in_flight=1), models={"m2": Limits(max_in_flight=None)}))
    held = adm.admit("a", "m")
    for _ in range(10):
        assert isinstance(adm.admit("b", "m"), Rejection)  # the model is full
    adm.release(held, tokens=0)
    assert sum(isinstance(adm.admit("b", "m2"), Ticket) for _ in range(10)) == 5  # b's minute is untouched


def test_tokens_are_charged_when_a_request_ends_and_refuse_until_refilled():
    adm, clock = admission(Policy(default_key=Limits(tokens_per_minute=600)))
    ticket = adm.admit("a", "m")
    assert isinstance(adm.admit("a", "m"), Ticket)  # nothing used yet
    adm.release(ticket, tokens=900)  # 300 over: the overshoot a request in flight may cause
    refused = adm.admit("a", "m")
    assert isinstance(refused, Rejection) and refused.limit == "tokens_per_minute"
    assert refused.retry_after_s == pytest.approx((300 + 1) * 60 / 600)
    clock.now += 30.2
    assert isinstance(adm.admit("a", "m"), Ticket)


def test_new_limits_apply_to_the_next_request_with_the_share_of_the_allowance_left():
    adm, clock = admission(Policy(default_key=Limits(requests_per_minute=1)))
    adm.admit("a", "m")
    assert isinstance(adm.admit("a", "m"), Rejection)
    clock.now += 1.5  # 2.5 % of a minute's allowance refilled
    adm.policy = Policy(default_key=Limits(requests_per_minute=1000))
    admitted = [adm.admit("a", "m") for _ in range(30)]
    assert sum(isinstance(t, Ticket) for t in admitted) == 25  # 2.5 % of the new allowance, not of the old
    adm.policy = Policy()
    assert isinstance(adm.admit("a", "m"), Ticket)


def test_a_lowered_limit_allows_no_burst_of_the_old_allowance():
    adm, _ = admission(Policy(default_key=Limits(requests_per_minute=600)))
    assert isinstance(adm.admit("a", "m"), Ticket)  # the bucket is (almost) full
    adm.policy = Policy(default_key=Limits(requests_per_minute=6))
    admitted = [adm.admit("a", "m") for _ in range(10)]
    assert sum(isinstance(t, Ticket) for t in admitted) == 5  # 599/600 of 6, rounded down


@pytest.mark.parametrize("text, fragment", [
    ("default_key: {requests_per_minute: -1}", "default_key.requests_per_minute"),
    ("keys: {k: {rpm: 3}}", "keys.k.rpm"),
    ("models: [a, b]", "models"),
    ("default_model: {max_in_flight: 0}", "max_in_flight"),
    ("default_key: {tokens_per_minute: .inf}", "default_key.tokens_per_minute: Input should be a finite number"),
    ("{not yaml", "not valid YAML"),
])
def test_a_bad_limits_file_says_where(text, fragment):
    with pytest.raises(PolicyError, match=r"limits\.yml") as info:
        parse_policy(text, "limits.yml")
    assert fragment in str(info.value)


def test_the_file_is_reread_when_it_changes_and_a_broken_one_keeps_the_limits(tmp_path, monkeypatch):
    monkeypatch.setattr("inferwatch.serving.admission.RELOAD_CHECK_S", 0.0)
    path, errors = tmp_path / "limits.yml", []
    path.write_text("default_key: {requests_per_minute: 10}\n")
    limits = PolicyFile(path, errors.append)
    assert limits.current().default_key.requests_per_minute == 10
    path.write_text("default_key: {requests_per_minute: 20}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert limits.current().default_key.requests_per_minute == 20
    path.write_text("default_key: {requests_per_minute: oops}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert limits.current().default_key.requests_per_minute == 20 and "keeping the limits in force" in errors[0]


def test_an_entry_overrides_only_the_limits_it_names_and_null_lifts_one():
    policy = parse_policy("default_key: {requests_per_minute: 10, tokens_per_minute: 500, max_in_flight: 2}\n"
                          "keys: {k: {requests_per_minute: 100}, free: {max_in_flight: null}}\n", "limits.yml")
    assert policy.for_key("k") == Limits(requests_per_minute=100, tokens_per_minute=500, max_in_flight=2)
    assert policy.for_key("free").max_in_flight is None and policy.for_key("free").tokens_per_minute == 500


def test_a_rate_under_one_a_minute_still_admits_one_request_now_and_then():
    adm, clock = admission(Policy(default_key=Limits(requests_per_minute=0.5)))
    assert isinstance(adm.admit("a", "m"), Ticket)
    refused = adm.admit("a", "m")
    assert isinstance(refused, Rejection) and refused.retry_after_s == pytest.approx(120.0)
    clock.now += 120
    assert isinstance(adm.admit("a", "m"), Ticket)
