"""The `tiermesh` command line: one parser with an explicit registry of sub-commands, and the
terminal views of a chat and of a trace. Each sub-command's heavy imports (torch, the mesh's
Envoy protos, matplotlib) happen when it runs, never when the parser is built."""
