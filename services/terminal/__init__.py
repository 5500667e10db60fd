"""Terminal views of a chat: the live draft-then-refinement view and the `--json` event lines.
Used by `tiermesh chat` and by `tiermesh run`'s demo; knows the client's events and rich only."""
