"""``/v1/groups``: open a group of multi-turn episodes; a group's state, its rollouts and
which of them have rewards; give a group up.

``POST /v1/groups {"size": G, "metadata": {...}}`` opens G empty episodes of one task and
returns their ``rollout_id``s; each episode is then driven with chat completions carrying its
``rollout_id`` (``gspo_rl.server.rollouts.episodes``) and ends with its reward (``POST
/v1/rewards``). ``POST /v1/groups/{id}/abandon`` ends an open group now (any group: sampled
or of episodes): an environment that will post no more rewards for it releases the admission
capacity it holds at once instead of at its deadline. The work is ``GroupServing``'s
(``gspo_rl.server.rollouts.serving.groups``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query

from gspo_rl.server.api.deps import GroupsDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.protocol.groups import AbandonOut, GroupOut, OpenGroupIn, OpenGroupOut

router = APIRouter(tags=["groups"])
GroupId = Annotated[str, Path(min_length=1, max_length=256)]


@router.post("/v1/groups", response_model=OpenGroupOut,
             dependencies=[Depends(admit_new_group)],
             responses=error_responses(*V1_POST, 501))
async def open_group(body: OpenGroupIn, groups: GroupsDep) -> OpenGroupOut:
    """Opens ``size`` empty multi-turn episodes as one group (recorded in Redis before the
    response, so every returned ``rollout_id`` can take turns and rewards at once)."""
    return await groups.open(body)


@router.post("/v1/groups/{group_id}/abandon", response_model=AbandonOut,
             responses=error_responses(*V1_POST, 404))
async def abandon_group(group_id: GroupId, groups: GroupsDep) -> AbandonOut:
    """Gives a group up: it stops counting as in flight at once and ends as at its deadline
    (published with its rewards when it has enough of them, else dropped). Idempotent. 404
    for an unknown group, or one whose records have expired."""
    return await groups.abandon(group_id)


# exclude_unset: ``trajectory`` appears only with ?include=tokens (every other field is set).
@router.get("/v1/groups/{group_id}", response_model=GroupOut, response_model_exclude_unset=True,
            responses=error_responses(401, 404, 422, 501, 503))
async def get_group(
    group_id: GroupId, groups: GroupsDep,
    include: Annotated[Literal["tokens"] | None, Query(
        description="'tokens': each rollout's trajectory (token ids, loss mask, log-probs, "
                    "versions, turns with decoded text, advantage once published)")] = None,
) -> GroupOut:
    """A group's state. 404 for an unknown group, or one whose records have expired."""
    return await groups.get(group_id, with_tokens=include == "tokens")
