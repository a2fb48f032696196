"""Tools and environments for agentic rollouts (docs/agent.md).

:class:`Tool` (:mod:`.base`) is what users subclass; :mod:`.worker` hosts one tool class in
a sandboxed process; :mod:`.sandbox` is the service side (deadlines, replacement of stuck or
dead workers); :mod:`.calculator` is the built-in example tool.
"""

from rollout_svc.tools.base import Tool

__all__ = ["Tool"]
