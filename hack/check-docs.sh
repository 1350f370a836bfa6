#!/usr/bin/env bash
# Checks the README and the book in docs/, offline:
#   1. every relative Markdown link (inline, image or reference-style) in README.md and
#      docs/**/*.md names a file or directory that exists (the #anchor part is not checked);
#   2. every chapter (docs/**/*.md other than SUMMARY.md) is listed in docs/SUMMARY.md;
#   3. README.md stays under 300 lines.
# Links inside fenced code blocks and inline code are not links and are skipped; so are
# absolute URLs (http:, https:, mailto:) and links to an anchor of the same page.
# Usage: hack/check-docs.sh   (from anywhere; exits 1 and names each problem otherwise)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

readme_max=300
problems=0
problem() {
  echo "check-docs: PROBLEM: $*" >&2
  problems=$((problems + 1))
}

# The link targets of a Markdown file, one per line, outside code fences and inline code.
link_targets() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)                       # inline code
      if (match(line, /^[ \t]*\[[^]]+\]:[ \t]+[^ \t]+/)) {   # [label]: target
        ref = substr(line, RSTART, RLENGTH)
        sub(/^[ \t]*\[[^]]+\]:[ \t]+/, "", ref)
        print ref
      }
      while (match(line, /\]\([^)]*\)/)) {             # [text](target "title")
        t = substr(line, RSTART + 2, RLENGTH - 3)
        line = substr(line, RSTART + RLENGTH)
        sub(/^[ \t]+/, "", t)
        sub(/[ \t].*$/, "", t)
        sub(/^</, "", t); sub(/>$/, "", t)
        if (t != "") print t
      }
    }
  ' "$1"
}

mapfile -t files < <({ echo README.md; find docs -name '*.md' -type f | sort; })
echo "check-docs: checking relative links in ${#files[@]} Markdown files (README.md and docs/**/*.md)"
links=0
for f in "${files[@]}"; do
  dir="$(dirname "$f")"
  while IFS= read -r target; do
    case "$target" in
      http://* | https://* | mailto:* | '#'*) continue ;;
    esac
    path="${target%%#*}"
    path="${path%%\?*}"
    [[ -z "$path" ]] && continue
    links=$((links + 1))
    if [[ "$path" == /* ]]; then
      problem "$f: link to an absolute path $target (use a path relative to $dir)"
    elif [[ ! -e "$dir/$path" ]]; then
      problem "$f: broken link $target ($dir/$path does not exist)"
    fi
  done < <(link_targets "$f")
done
echo "check-docs: $links relative links checked"

summary=docs/SUMMARY.md
echo "check-docs: checking that every chapter is listed in $summary"
if [[ ! -f "$summary" ]]; then
  problem "$summary is missing"
else
  listed="$(link_targets "$summary" | sed -e 's/#.*$//' -e 's|^\./||')"
  chapters=0
  while IFS= read -r chapter; do
    rel="${chapter#docs/}"
    [[ "$rel" == SUMMARY.md ]] && continue
    chapters=$((chapters + 1))
    if ! grep -qxF -- "$rel" <<<"$listed"; then
      problem "$chapter is not listed in $summary (add a line: - [Title]($rel))"
    fi
  done < <(find docs -name '*.md' -type f | sort)
  echo "check-docs: $chapters chapters"
fi

echo "check-docs: checking that README.md stays under $readme_max lines"
lines="$(wc -l <README.md)"
if ((lines >= readme_max)); then
  problem "README.md has $lines lines (at most $((readme_max - 1))): move the detail into a chapter of docs/"
else
  echo "check-docs: README.md has $lines lines"
fi

if ((problems > 0)); then
  echo "check-docs: FAILED: $problems problem(s)" >&2
  exit 1
fi
echo "check-docs: OK"
