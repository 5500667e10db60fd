"""The state of an interactive `tiermesh chat`, without I/O: the conversation so far (each turn a
question and the final answer's text), the mode and tier the next turn is sent with, and the
slash commands that change them. Knows nothing of gRPC, terminals or the client; the session
loop (interactive_chat.py) reads the lines, sends the turns and shows the answers."""

from __future__ import annotations

from dataclasses import dataclass

from tiermesh.client.requests import MODES

from services.common.tiers import TIER_NAMES

HELP = """\
/mode routed|progressive|pinned   how the next questions are answered (/mode alone: the current)
/tier small|medium|large          pin the next questions to that tier (mode pinned)
/new                              forget the conversation and start a new one
/help                             this list
/quit                             leave (or Ctrl-D, or Ctrl-C at the prompt)
Ctrl-C during an answer cancels it. Anything else is a question, sent with the conversation."""

Message = tuple[str, str]  # (role, content), as the client's `messages` takes them


@dataclass(frozen=True)
class Turn:
    question: str
    answer: str  # the final revision's text


@dataclass(frozen=True)
class CommandReply:
    """What a command has to say to the user, and whether the session ends."""

    text: str
    quit: bool = False


class Conversation:
    """The turns so far and how the next question is sent. Turns are only ever dropped from
    the front, and only once a question was answered without them (`answered(..., drop=k)`):
    a question that fails or is cancelled leaves the conversation as it was."""

    def __init__(self, mode: str = "routed", tier: str = "") -> None:
        self.mode = mode
        self.tier = tier
        self.turns: list[Turn] = []
        self.forgotten = 0  # turns dropped since the conversation began: no tier held them

    def messages(self, question: str, drop: int = 0) -> list[Message]:
        """The request's `messages`: every turn but the `drop` oldest, then `question`."""
        messages: list[Message] = []
        for turn in self.turns[drop:]:
            messages += [("user", turn.question), ("assistant", turn.answer)]
        return [*messages, ("user", question)]

    def can_drop(self, drop: int) -> bool:
        """Whether `drop` of the oldest turns can be left out (at least the question remains)."""
        return 0 <= drop <= len(self.turns)

    def answered(self, question: str, answer: str, drop: int = 0) -> None:
        """`question` was answered, sent without the `drop` oldest turns: those are forgotten."""
        self.forgotten += drop
        self.turns = [*self.turns[drop:], Turn(question, answer)]

    def clear(self) -> None:
        self.turns = []
        self.forgotten = 0

    def describe(self) -> str:
        """The mode, and the tier when pinned: "progressive", "pinned to small"."""
        return f"pinned to {self.tier}" if self.mode == "pinned" else self.mode


def is_command(line: str) -> bool:
    return line.startswith("/")


def run_command(line: str, conversation: Conversation) -> CommandReply:
    """Applies one slash command to `conversation`; an unknown or malformed one changes nothing
    and says why."""
    name, *args = line.split()
    if name in ("/quit", "/exit"):
        return CommandReply("", quit=True)
    if name == "/help":
        return CommandReply(HELP)
    if name == "/new":
        conversation.clear()
        return CommandReply(f"new conversation ({conversation.describe()})")
    if name == "/mode":
        return _set_mode(conversation, args)
    if name == "/tier":
        return _set_tier(conversation, args)
    return CommandReply(f"unknown command {name}; /help lists them")


def _set_mode(conversation: Conversation, args: list[str]) -> CommandReply:
    if not args:
        return CommandReply(f"mode: {conversation.describe()}")
    if len(args) != 1 or args[0] not in MODES:
        return CommandReply(f"usage: /mode {'|'.join(MODES)}")
    if args[0] == "pinned" and not conversation.tier:
        return CommandReply(f"mode pinned needs a tier: /tier {'|'.join(TIER_NAMES)}")
    conversation.mode = args[0]
    return CommandReply(f"mode: {conversation.describe()}")


def _set_tier(conversation: Conversation, args: list[str]) -> CommandReply:
    if len(args) != 1 or args[0] not in TIER_NAMES:
        return CommandReply(f"usage: /tier {'|'.join(TIER_NAMES)}")
    conversation.mode, conversation.tier = "pinned", args[0]
    return CommandReply(f"mode: {conversation.describe()}")
