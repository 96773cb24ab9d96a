"""The bench as the tenant's reviewer: which pending samples it approves or rejects, and the bulk review
calls that do it (see ``driver``'s docstring, step 3)."""

from __future__ import annotations

from clawhub.devtools.personas.tracks import Track

APPROVABLE_FLAGS = {"new_key", "split_votes"}
REJECTED_FLAGS = {"member_outlier", "consensus_disagreement"}


def review_decisions(samples: list[dict], *, group: bool) -> tuple[list[int], list[int]]:
    """(approve, reject) among pending samples, by their flags: see ``driver``'s docstring, step 3."""
    approve, reject = [], []
    for sample in samples:
        if sample.get("state") != "pending":
            continue
        codes = {f.get("code", "") for f in sample.get("flags") or []}
        if group and codes & REJECTED_FLAGS:
            reject.append(sample["id"])
        elif codes <= APPROVABLE_FLAGS:
            approve.append(sample["id"])
    return approve, reject


def review(track: Track) -> tuple[int, int]:
    """Approves and rejects the tenant's pending samples by ``review_decisions``; (approved, rejected)."""
    api = track.owner.api
    page = api.get("/api/review/samples/", params={"tenant": track.tenant_id, "state": "pending",
                                                   "page_size": 500})
    approve, reject = review_decisions(page["results"], group=bool(track.slug))
    authors = {s["id"]: (s.get("user") or {}).get("email") for s in page["results"]}
    sessions = {m.email: m.sessions for m in track.members}
    for sample in page["results"]:
        email = authors.get(sample["id"])
        if any(f.get("code") == "consensus_disagreement" for f in sample.get("flags") or []):
            track.consensus_flagged.setdefault(email, sessions.get(email, 0))
    own = [i for i in approve if authors.get(i) == track.owner.email]
    admin = track.members[1].api if track.slug else api  # a group's owner may not approve their own
    for reviewer, ids in ((api, [i for i in approve if i not in own]), (admin, own)):
        if ids:
            reviewer.post("/api/review/samples/bulk/", {
                "ids": ids, "action": "approve",
                "reason": "bench: only the new-key guard held it (bench keys are minutes old)"})
    if reject:
        api.post("/api/review/samples/bulk/", {
            "ids": reject, "action": "reject",
            "reason": "bench: member_outlier or consensus_disagreement flagged by the group's guards"})
    return len(approve), len(reject)
