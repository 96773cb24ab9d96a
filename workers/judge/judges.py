"""Judges: read one assistant turn and what came right after it, and score it (OpenClaw-RL's PRM semantics).

Plain data in (``JudgeInput``), plain data out (``JudgeResult``); nothing here knows about Django. Two
backends with the same output shape:

- ``LLMJudge`` asks any OpenAI-compatible endpoint ``votes`` times for a ``\\boxed{}`` verdict and
  ``hint_votes`` times for an on-policy-distillation hint, all concurrently, never more than ``concurrency``
  requests at once.
- ``RuleJudge`` is deterministic: phrases and patterns that count as negative or positive feedback, tool
  errors, and hint templates keyed by the rule that matched. A tenant's own patterns are compiled with RE2, a
  linear-time engine, so no pattern (``(a+)+$``) can pin a shared judge worker; what RE2 cannot compile
  (backreferences, lookaround) is refused when the rules are saved.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import re2

from workers.judge import prompts
from workers.judge.parsing import MIN_HINT_CHARS, boxed_score, extract_hint, majority_vote
from workers.judge.rendering import render_history, render_message, render_tools
from workers.messages import content_text
from workers.upstream_errors import body_shape

logger = logging.getLogger("workers.judge")

MAIN = "main"


class JudgeError(Exception):
    """The judge cannot score this turn; asking again will not help (a 4xx, an unusable answer)."""


class TransientJudgeError(JudgeError):
    """The judge endpoint could not be reached or was overloaded; asking again later may succeed."""


@dataclass
class JudgeInput:
    messages: list[dict[str, Any]]  # the prompt of the turn, as the client sent it
    response: dict[str, Any]  # the assistant message it got back: content and/or tool_calls
    next_state: list[dict[str, Any]] | None  # the user/tool messages that followed; None = closed without
    tools: list[dict[str, Any]] = field(default_factory=list)
    turn_type: str = MAIN


@dataclass
class Vote:
    raw: str  # the judge's whole answer
    score: int | None  # what parsing made of it; None = no valid verdict


@dataclass
class JudgeResult:
    reward: int  # -1, 0 or 1
    votes: list[Vote]
    hint_votes: list[Vote]
    hints: list[str]  # accepted hints, in the order the judge wrote them
    judge: str
    prompt_version: str

    @property
    def raw_outputs(self) -> dict[str, list[str]]:
        return {"prm": [v.raw for v in self.votes], "hint": [v.raw for v in self.hint_votes]}


class Judge(ABC):
    name: str
    prompt_version: str

    def judge(self, inp: JudgeInput) -> JudgeResult:
        if inp.turn_type != MAIN:
            raise ValueError("side turns are never judged")
        if not inp.next_state:
            # Closed without a next state: there is no evidence either way, and OpenClaw-RL masks such turns
            # (reward 0), so asking a model would only cost time.
            return JudgeResult(reward=0, votes=[], hint_votes=[], hints=[], judge=self.name,
                               prompt_version=self.prompt_version)
        return self._judge(inp)

    @abstractmethod
    def _judge(self, inp: JudgeInput) -> JudgeResult: ...

    @classmethod
    @abstractmethod
    def from_config(cls, config: Any, *, rules: Mapping[str, Any] | None = None) -> Judge:
        """The judge the task uses: ``config`` has the CLAWHUB_JUDGE_* settings as attributes (Django's
        settings, or any object), ``rules`` a tenant's own rules (JudgeRules' fields) or None."""

    def close(self) -> None:  # noqa: B027 - only judges that hold connections need it
        pass


def prompt_fields(inp: JudgeInput) -> dict[str, str]:
    return {
        "history": render_history(inp.messages),
        "tools": render_tools(inp.tools),
        "response": render_message({"role": "assistant", **inp.response}),
        "next_state": "\n\n".join(render_message(m) for m in inp.next_state or []) or "(nothing)",
    }


# --- LLM judge ----------------------------------------------------------------------------------------------


class LLMJudge(Judge):
    """A judge model behind an OpenAI-compatible ``/chat/completions``. One instance per process is meant to
    be shared: its semaphore bounds the requests in flight across every turn it judges, and its client pools
    connections. Thread-safe."""

    name = "llm"
    # One per process and configuration: its semaphore bounds the requests of every task this worker runs,
    # and its connection pool is reused from turn to turn.
    _shared: dict[tuple, LLMJudge] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Any, *, rules: Mapping[str, Any] | None = None) -> LLMJudge:
        key = (
            config.CLAWHUB_JUDGE_BASE_URL, config.CLAWHUB_JUDGE_MODEL, config.CLAWHUB_JUDGE_API_KEY,
            config.CLAWHUB_JUDGE_VOTES, config.CLAWHUB_JUDGE_HINT_VOTES, config.CLAWHUB_JUDGE_TEMPERATURE,
            config.CLAWHUB_JUDGE_MAX_TOKENS, config.CLAWHUB_JUDGE_TIMEOUT, config.CLAWHUB_JUDGE_CONCURRENCY,
            config.CLAWHUB_JUDGE_HTTP_RETRIES,
        )
        with cls._shared_lock:
            judge = cls._shared.get(key)
            if judge is None:
                judge = cls._shared[key] = cls(
                    base_url=key[0], model=key[1], api_key=key[2], votes=key[3], hint_votes=key[4],
                    temperature=key[5], max_tokens=key[6], timeout=key[7], concurrency=key[8],
                    max_retries=key[9],
                )
            return judge

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        votes: int = 3,
        hint_votes: int = 1,
        temperature: float = 0.6,
        max_tokens: int = 4096,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        concurrency: int = 8,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        prompt_version: str = prompts.PROMPT_VERSION,
        transport: httpx.BaseTransport | None = None,
    ):
        if not base_url:
            raise ValueError("LLMJudge needs a base_url (CLAWHUB_JUDGE_BASE_URL)")
        if votes < 1 or hint_votes < 0 or concurrency < 1 or max_retries < 0:
            raise ValueError("votes and concurrency must be >= 1, hint_votes and max_retries >= 0")
        self.model = model
        self.votes = votes
        self.hint_votes = hint_votes
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.prompt_version = prompt_version
        prompts.template("prm", prompt_version)  # fail at start-up, not on the first turn
        prompts.template("hint", prompt_version)
        self._slots = threading.BoundedSemaphore(concurrency)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(connect_timeout, timeout)),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def _judge(self, inp: JudgeInput) -> JudgeResult:
        fields = prompt_fields(inp)
        prm = prompts.render("prm", version=self.prompt_version, **fields)
        hint = prompts.render("hint", version=self.prompt_version, **fields)
        jobs = [prm] * self.votes + [hint] * self.hint_votes
        # One thread per request; the semaphore inside complete() is what bounds the load on the endpoint.
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="judge") as pool:
            outputs = list(pool.map(self.complete, jobs))
        votes = [Vote(raw=text, score=boxed_score(text)) for text in outputs[: self.votes]]
        hint_votes = [Vote(raw=text, score=boxed_score(text)) for text in outputs[self.votes:]]
        hints = []
        for vote in hint_votes:
            accepted = extract_hint(vote.raw) if vote.score == 1 else None
            if accepted and accepted not in hints:
                hints.append(accepted)
        return JudgeResult(reward=majority_vote(v.score for v in votes), votes=votes, hint_votes=hint_votes,
                           hints=hints, judge=self.name, prompt_version=self.prompt_version)

    def complete(self, prompt: str) -> str:
        """The judge model's answer to ``prompt``; retries connection errors, 429 and 5xx with backoff."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stream": False,
        }
        error: TransientJudgeError | None = None
        for attempt in range(self.max_retries + 1):
            delay = self.retry_backoff * 2**attempt
            try:
                with self._slots:
                    response = self._client.post("/chat/completions", json=body)
            except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
                error = TransientJudgeError(f"judge endpoint unreachable: {exc!r}")
            else:
                status = response.status_code
                if status == 429 or status >= 500:
                    error = TransientJudgeError(f"judge endpoint answered {status}: {body_shape(response)}")
                    delay = max(delay, _retry_after(response))
                elif status >= 400:
                    raise JudgeError(f"judge endpoint refused the request ({status}): {body_shape(response)}")
                else:
                    return _answer_text(response)
            if attempt < self.max_retries:
                logger.warning("judge request failed (%s); retry %d/%d", error, attempt + 1, self.max_retries)
                time.sleep(min(delay, 30.0))
        assert error is not None
        raise error


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", 0)), 30.0)
    except ValueError:
        return 0.0


def _answer_text(response: httpx.Response) -> str:
    try:
        message = response.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise JudgeError(f"judge endpoint answered without a message: {body_shape(response)}") from exc
    # Reasoning models served with a reasoning parser may leave content empty and put everything in reasoning.
    text = content_text(message.get("content"), placeholders=True)
    return text or str(message.get("reasoning_content") or "")


# --- rule judge ---------------------------------------------------------------------------------------------

TOOL_ERROR_RULE = "tool error"
TOOL_SUCCESS_RULE = "tool success"

# A tool result reads as failed if it says "error" (but not "no errors"/"0 errors"), shows a Python traceback,
# or reports a non-zero exit.
_TOOL_ERROR = re.compile(
    r"(?<!\bno )(?<!\b0 )\berrors?\b|\btraceback\b"
    r"|\bexit(?:ed)?(?: with)?\s*(?:code|status)\s*[:=]?\s*-?[1-9]\d*"
    r"|[\"']?(?:exit_?code|exitcode|returncode|return_code)[\"']?\s*[:=]\s*-?[1-9]\d*",
    re.IGNORECASE,
)

DEFAULT_NEGATIVE: tuple[dict[str, str], ...] = (
    {"name": "please don't", "pattern": r"\bplease\s+(?:don['’]?t|do\s+not)\b|\bdon['’]?t\s+do\s+that\b"},
    {"name": "that's wrong",
     "pattern": r"\b(?:that['’]?s|that\s+is|this\s+is|it['’]?s)\s+(?:wrong|incorrect|not\s+right)\b"},
    {"name": "redo", "pattern": r"\bre-?do\b|\bdo\s+it\s+over\b"},
    {"name": "again", "pattern": r"(?<!thanks )(?<!thank you )\bagain\b"},
    {"name": "I said", "pattern": r"\bI\s+(?:said|told\s+you)\b"},
    {"name": "not what I asked", "pattern": r"\bnot\s+what\s+I\s+(?:asked|wanted|meant)\b"},
    {"name": "you forgot", "pattern": r"\byou\s+(?:forgot|missed|ignored)\b"},
)
DEFAULT_POSITIVE: tuple[dict[str, str], ...] = (
    {"name": "thanks", "pattern": r"\b(?:thanks|thank\s+you|thx)\b"},
    {"name": "approval",
     "pattern": r"\b(?:perfect|looks\s+good|that\s+works|works\s+now|exactly\s+what\s+I)\b"},
    {"name": "next question",
     "pattern": r"\b(?:next\s+question|next\s+one|moving\s+on|let['’]?s\s+move\s+on)\b"},
)
DEFAULT_HINTS: dict[str, str] = {
    "please don't": 'The user does not want this; follow their instruction: "{feedback}"',
    "that's wrong": 'The previous answer was wrong; the user corrected it: "{feedback}"',
    "I said": 'Do exactly what the user asked; they had to repeat: "{feedback}"',
    "not what I asked": 'Answer the request the user actually made; they clarified: "{feedback}"',
    "you forgot": 'Cover every part of the request; the user pointed out: "{feedback}"',
    TOOL_ERROR_RULE: "The tool call failed ({feedback}); check the tool's arguments and preconditions first.",
}
_FEEDBACK_CHARS = 300


# Caps on one tenant's rules (each list), so that a rule set cannot grow into a slow judge either.
MAX_TENANT_RULES = 50
MAX_PATTERN_CHARS = 500
# RE2's budget for one compiled pattern; a pattern that needs more (huge counted repetitions) is refused.
_RE2_MAX_MEM = 1 << 20


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # a tenant's bad pattern is their error message, not worker log noise
    options.max_mem = _RE2_MAX_MEM
    return options


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Any  # re.Pattern for ClawHub's own rules, an RE2 pattern for a tenant's; both have .search()


def phrase_pattern(phrase: str) -> str:
    """A case-insensitive pattern for a plain phrase: whole words, any whitespace between them, and an
    optional (straight or curly) apostrophe wherever the phrase has one, so "that's" also matches "thats"."""
    words = [re.escape(w).replace("'", "['’]?").replace("’", "['’]?") for w in phrase.split()]
    body = r"\s+".join(words)
    start = r"\b" if phrase[:1].isalnum() else ""
    end = r"\b" if phrase[-1:].isalnum() else ""
    return f"{start}{body}{end}"


def compile_rule(spec: str | Mapping[str, Any], *, trusted: bool = False) -> Rule:
    """A rule from a tenant's configuration: a phrase ("not what I asked"), a regular expression written
    "re:<pattern>", or {"name", "pattern", "regex": bool}. Raises ValueError with the reason when invalid.

    Tenant rules (``trusted`` false) are capped in length and compiled with RE2. ClawHub's own defaults use
    Python's engine (they need lookbehind) and are reviewed here, not typed in by users.
    """
    if isinstance(spec, str):
        if spec.startswith("re:"):
            name, pattern, regex = spec, spec[3:], True
        else:
            name, pattern, regex = spec, spec, False
    elif isinstance(spec, Mapping) and isinstance(spec.get("pattern"), str):
        pattern = spec["pattern"]
        name = str(spec.get("name") or pattern)
        regex = bool(spec.get("regex", True))
    else:
        raise ValueError(f"a rule is a phrase, 're:<pattern>' or {{'name', 'pattern'}}, not {spec!r}")
    if not pattern.strip():
        raise ValueError("a rule's pattern is empty")
    source = pattern if regex else phrase_pattern(pattern.strip())
    if trusted:
        try:
            return Rule(name=name, pattern=re.compile(source, re.IGNORECASE))
        except re.error as exc:
            raise ValueError(f"rule {name!r}: invalid regular expression: {exc}") from exc
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"rule {name[:40]!r}: a pattern has at most {MAX_PATTERN_CHARS} characters")
    try:
        compiled = re2.compile(source, _re2_options())
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(f"rule {name!r}: invalid regular expression (RE2 syntax: no backreferences or "
                         f"lookaround): {reason}") from exc
    return Rule(name=name, pattern=compiled)


@dataclass(frozen=True)
class RuleSet:
    negative: tuple[Rule, ...]
    positive: tuple[Rule, ...]
    hints: Mapping[str, str]
    fingerprint: str  # identifies the exact rules, recorded as the judgment's prompt version

    @classmethod
    def build(
        cls,
        *,
        negative: Iterable[str | Mapping[str, Any]] = (),
        positive: Iterable[str | Mapping[str, Any]] = (),
        hints: Mapping[str, str] | None = None,
        extend_defaults: bool = True,
    ) -> RuleSet:
        """The default rules plus a tenant's (or the tenant's alone when ``extend_defaults`` is false)."""
        negative, positive, hints = list(negative), list(positive), dict(hints or {})
        for label, rules in (("negative", negative), ("positive", positive)):
            if len(rules) > MAX_TENANT_RULES:
                raise ValueError(f"at most {MAX_TENANT_RULES} {label} rules, not {len(rules)}")
        compiled_negative = [compile_rule(s) for s in negative]
        compiled_positive = [compile_rule(s) for s in positive]
        if extend_defaults:
            compiled_negative = [*_DEFAULT_NEGATIVE_RULES, *compiled_negative]
            compiled_positive = [*_DEFAULT_POSITIVE_RULES, *compiled_positive]
            negative = [*DEFAULT_NEGATIVE, *negative]
            positive = [*DEFAULT_POSITIVE, *positive]
            hints = {**DEFAULT_HINTS, **hints}
        for name, text in hints.items():
            if not isinstance(name, str) or not isinstance(text, str):
                raise ValueError("hint templates map a rule name to a text")
        canonical = json.dumps([negative, positive, sorted(hints.items())], sort_keys=True, default=str)
        return cls(
            negative=tuple(compiled_negative),
            positive=tuple(compiled_positive),
            hints=hints,
            fingerprint=hashlib.sha256(canonical.encode()).hexdigest()[:12],
        )


_DEFAULT_NEGATIVE_RULES = tuple(compile_rule(s, trusted=True) for s in DEFAULT_NEGATIVE)
_DEFAULT_POSITIVE_RULES = tuple(compile_rule(s, trusted=True) for s in DEFAULT_POSITIVE)


def tool_failed(text: str) -> bool:
    return bool(_TOOL_ERROR.search(text))


class RuleJudge(Judge):
    """Deterministic judge. Negative evidence wins over positive (a change request is negative even when it
    comes with thanks); a tool result that ran without error counts as success. It answers with ``votes``
    identical votes so that a judgment from it looks like one from the LLM judge."""

    name = "rule"

    @classmethod
    def from_config(cls, config: Any, *, rules: Mapping[str, Any] | None = None) -> RuleJudge:
        """The default rules, or the tenant's (``negative_patterns``, ``positive_patterns``,
        ``hint_templates``, ``extend_defaults``). Rules saved before patterns were compiled with RE2 and
        capped are refused here: such a tenant is judged by the defaults until it fixes them."""
        try:
            ruleset = RuleSet.build() if rules is None else RuleSet.build(
                negative=rules["negative_patterns"], positive=rules["positive_patterns"],
                hints=rules["hint_templates"], extend_defaults=rules["extend_defaults"],
            )
        except ValueError as exc:
            logger.warning("tenant %s: judge rules refused (%s); using the default rules",
                           rules.get("tenant_id") if rules else None, exc)
            ruleset = RuleSet.build()
        return cls(ruleset, votes=config.CLAWHUB_JUDGE_VOTES)

    def __init__(self, rules: RuleSet | None = None, *, votes: int = 3):
        self.rules = rules or RuleSet.build()
        self.votes = max(1, votes)
        self.prompt_version = f"rules-{self.rules.fingerprint}"

    def _judge(self, inp: JudgeInput) -> JudgeResult:
        texts = [(m.get("role"), content_text(m.get("content"), placeholders=True))
                 for m in inp.next_state or []]
        user_text = "\n".join(t for role, t in texts if role != "tool").strip()
        tool_texts = [t for role, t in texts if role == "tool"]
        everything = "\n".join(t for _, t in texts)

        negative = [r.name for r in self.rules.negative if r.pattern.search(everything)]
        if any(tool_failed(t) for t in tool_texts):
            negative.append(TOOL_ERROR_RULE)
        positive = [r.name for r in self.rules.positive if r.pattern.search(everything)]
        if tool_texts and TOOL_ERROR_RULE not in negative:
            positive.append(TOOL_SUCCESS_RULE)

        score = -1 if negative else 1 if positive else 0
        matched = negative if negative else positive
        explanation = (f"matched {'negative' if negative else 'positive'} rules: {', '.join(matched)}"
                       if matched else "no rule matched")
        raw = f"{explanation}\n\\boxed{{{score}}}"

        feedback = _one_line(user_text or "\n".join(tool_texts))
        hints: list[str] = []
        for name in [*negative, *positive]:
            template = self.rules.hints.get(name)
            if template:
                hint = template.replace("{feedback}", feedback).replace("{rule}", name).strip()
                if len(hint) > MIN_HINT_CHARS and hint not in hints:
                    hints.append(hint)
        hint_raw = ("".join(f"[HINT_START]{h}[HINT_END]\n" for h in hints) + "\\boxed{1}") if hints \
            else "no hint template for the matched rules\n\\boxed{-1}"
        return JudgeResult(
            reward=score,
            votes=[Vote(raw=raw, score=score) for _ in range(self.votes)],
            hint_votes=[Vote(raw=hint_raw, score=1 if hints else -1)],
            hints=hints,
            judge=self.name,
            prompt_version=self.prompt_version,
        )


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _FEEDBACK_CHARS else flat[: _FEEDBACK_CHARS - 1] + "…"
