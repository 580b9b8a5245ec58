"""Adapters that let agent frameworks ask humans through question-broker.

One module per framework, each an optional extra imported only when used:

- ``broker_adapters.langgraph`` (``question-broker[langgraph]``): answer a graph's
  ``interrupt()`` (``ask_human``, text, ``HumanInTheLoopMiddleware``, Agent Inbox) through
  the broker, keyed by interrupt id, and resume it with ``Command(resume=...)``;
- ``broker_adapters.pydantic_ai`` (``question-broker[pydantic-ai]``): decide deferred tool
  calls (approvals and questions), after the run or in it (``HandleDeferredToolCalls``);
- ``broker_adapters.openai_agents`` (``question-broker[openai-agents]``): the
  ``ask_user_question`` tool with the full request shape, and tool approvals
  (``needs_approval``) routed through the broker;
- ``broker_adapters.tool``: the framework-neutral ``ask_user_question`` function the tools
  are built from (pydantic models of the seeds' request, intent and detail included).

The Claude Code permission hook is a command: ``qbroker claude-hook``. Importing this
package imports no framework. See docs/integrations.md.
"""

from __future__ import annotations

from ._approvals import APPROVE, DENY, Asker, Verdict, approval_request, verdicts

__all__ = ["APPROVE", "DENY", "Asker", "Verdict", "approval_request", "verdicts"]
