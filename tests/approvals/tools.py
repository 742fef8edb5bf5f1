"""Tools for the approval tests: each run is recorded in the database (an auth ``Group`` named
after it), so that a test can assert a tool did not run, or ran exactly once."""

from django.contrib.auth.models import Group

from conversations.tools import tool


def runs(prefix="refund"):
    """How many times the tools ran (rows they wrote)."""
    return Group.objects.filter(name__startswith=f"{prefix}:").count()


@tool(approval=True, summary=lambda arguments: f"Refund order {arguments.get('order')} in full.")
def refund(order: str) -> str:
    """Refund an order in full."""
    number = Group.objects.filter(name__startswith="refund:").count() + 1
    Group.objects.create(name=f"refund:{order}:{number}")
    return f"Order {order} refunded."


@tool(approval=lambda arguments, visitor: arguments["amount"] > 100,
      summary=lambda arguments: f"Pay back {arguments['amount']} on order {arguments['order']}.")
def partial_refund(order: str, amount: int) -> str:
    """Pay back part of an order."""
    Group.objects.create(name=f"refund:{order}:{amount}")
    return f"{amount} paid back on {order}."


@tool(approval=True, approver="staff", summary=lambda arguments: f"Close the account {arguments['account']}.")
def close_account(account: str) -> str:
    """Close an account (staff must approve)."""
    Group.objects.create(name=f"refund:close:{account}")
    return f"Account {account} closed."


@tool(idempotent=True)
def order_status(order: str) -> str:
    """Where an order is (read-only, no approval)."""
    Group.objects.create(name=f"status:{order}")
    return f"Order {order} is on its way."


@tool(idempotent=True)
def slow_status(order: str) -> str:
    """Where an order is, slowly (the test presses Stop meanwhile)."""
    import time

    from django.core.cache import cache

    cache.set("test:slow-started", True)
    time.sleep(1.5)
    return f"Order {order} is on its way."


TOOLS = [f"{__name__}.{name}" for name in ("refund", "partial_refund", "close_account", "order_status",
                                           "slow_status")]
