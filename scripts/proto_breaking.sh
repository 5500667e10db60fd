#!/usr/bin/env bash
# Fails when the working tree's protos/ breaks the tiermesh.v1 contract as it stood on main (buf breaking).
#
# Usage: scripts/proto_breaking.sh [BUF]   (BUF defaults to .tools/node_modules/.bin/buf; `make lint` passes it)
#
# The base it compares against:
#   - on a feature branch (HEAD is not main's tip): git merge-base HEAD main, i.e. main as the
#     branch found it, so everything the branch changed in protos/ is checked;
#   - on main itself (CI runs on a fresh clone of main): HEAD~1, i.e. the change just merged;
#   - `main` is taken from the local branch, else from origin/main;
#   - a repository with a single commit, or a base without protos/, has nothing to compare: skip.
# The rules (category FILE, and why) are in buf.yaml; what a failure means is in protos/README.md.
set -euo pipefail

buf=${1:-.tools/node_modules/.bin/buf}
# resolve a relative BUF against the caller's directory before moving to the repository root
if [[ $buf == */* && $buf != /* ]]; then
	buf="$PWD/$buf"
fi
cd "$(git rev-parse --show-toplevel)"
if ! command -v "$buf" >/dev/null; then
	echo "proto_breaking.sh: buf not found at '$buf' (make setup installs it)" >&2
	exit 2
fi

if main=$(git rev-parse --verify --quiet 'refs/heads/main^{commit}'); then
	main_name=main
elif main=$(git rev-parse --verify --quiet 'refs/remotes/origin/main^{commit}'); then
	main_name=origin/main
else
	echo "proto_breaking.sh: neither a main branch nor origin/main here; cannot tell what to compare against" >&2
	exit 2
fi

head=$(git rev-parse HEAD)
if [[ $head == "$main" ]]; then
	if ! base=$(git rev-parse --verify --quiet 'HEAD~1^{commit}'); then
		if [[ $(git rev-parse --is-shallow-repository) == true ]]; then
			echo "proto_breaking.sh: shallow clone without HEAD~1; fetch more history (git fetch --deepen=1)" >&2
			exit 2
		fi
		echo "buf breaking: skipped, HEAD ($head) is the repository's only commit; nothing to compare against"
		exit 0
	fi
	why="HEAD~1, HEAD is $main_name"
else
	if ! base=$(git merge-base HEAD "$main"); then
		echo "proto_breaking.sh: HEAD and $main_name have no common commit here (a shallow clone? fetch more history)" >&2
		exit 2
	fi
	why="merge-base of HEAD and $main_name"
fi

if ! git cat-file -e "$base:protos" 2>/dev/null; then
	echo "buf breaking: skipped, $base has no protos/; nothing to compare against"
	exit 0
fi

echo "buf breaking: protos/ against $base ($(git log -1 --format=%s "$base" | cut -c1-100)) [$why]"
# git input: buf clones this repository's git directory at exactly that commit (ref= needs the
# full sha; depth=1 is enough because the sha is fetched directly) and reads protos/ from it.
# --git-common-dir, not .git: in a `git worktree`, .git is a file and the objects live there.
git_dir=$(cd "$(git rev-parse --git-common-dir)" && pwd)
"$buf" breaking protos --against "$git_dir#ref=$base,depth=1,subdir=protos"
echo "buf breaking: no breaking changes"
