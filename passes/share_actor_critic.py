"""share-actor-critic: the structural transformation ac = 1 of Sec. VI / App. A-J2b (S1).

Replaces the trainable policy and critic by one actor_critic model with a merged training vertex.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rpegc.core.lower.share_actor_critic import share_actor_critic
from rpegc.core.ir.stages import CYCLIC, TRANSFORMS_G, PassStages
from rpegc.passes.program_pass import transform


@dataclass(frozen=True)
class ShareActorCriticPass(ModulePass):
    name = "share-actor-critic"
    stages = PassStages(needs=CYCLIC, does=TRANSFORMS_G)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        transform(self.name, op, share_actor_critic)
