"""What an algorithm tells the engine about how to run its maths, apart from the maths: which random stream it
draws on, and whether its draws branch the round's end or fall in its local steps (how the engine batches its runs).
`Algorithm` inherits these with their defaults; an algorithm sets one only where its maths needs it. Whether its
participants may each take their own number of local steps is not declared: a dry round finds it
(`fedbench.engine.dry_round`).
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping


class EngineHints:
    """The engine's hints an algorithm may declare (`Algorithm` inherits them): none changes what a round computes,
    only how the engine schedules, batches and checks it."""

    random_stream: ClassVar[str] = "algorithm"
    """The name of the run's random stream that `rnd.draw` and `round_length` draw from (default "algorithm")."""
    draws_at_round_end: ClassVar[bool] = False
    """True: a round's last step branches in Python on `rnd.draw` (ASVRCD-PFL's coins), so that the engine ends such
    rounds one run at a time. Default False."""

    @classmethod
    def draws_in_steps(cls, hp: Mapping[str, Any]) -> bool:
        """Whether its local steps other than a round's last draw (`rnd.draw`) with these hyperparameters, which an
        iteration-wise program does not allow (its runs' steps then run one after another). Default False.

        Args:
            hp: the resolved hyperparameters by name, as Python values.

        Example:
            ASVRCD-PFL flips a ρ-coin at every iteration unless refreshes count as communications:

            ```python
            @classmethod
            def draws_in_steps(cls, hp):
                return not hp["count_refresh"]
            ```
        """
        return False
