#!/usr/bin/env bash
# The --plan excerpts quoted in the configs' comments are what --plan prints now.
#
# A config may quote --plan in its leading comment as a command and the lines it prints:
#
#   ;   $ build/gtrain --plan configs/llama3_8b.ini --world 8
#   ;   auto: dist.shard optimizer, grad_sync -, recompute 32 blocks: ...
#   ;     total 69.99 GiB (activations 13.36 GiB) fits the budget ...
#   ;
#
# The block is the lines indented by two or more blanks after the ";" that follow the command; prose
# (one blank) or a bare ";" ends it. Each quoted line must be a line of the command's output (runs of
# blanks count as one), in the same order; a "..." line stands for lines left out. So a number in
# such a block is the planner's, and a planner change that moves it fails here, naming the config
# and the line, until the comment is updated from the printed output.
#   config_comments_match_plan.sh GTRAIN SOURCE_DIR
set -euo pipefail
gtrain=$1
cd "$2"
norm() { sed -e 's/[[:space:]]\{1,\}/ /g' -e 's/^ //' -e 's/ $//'; }
blocks=0 bad=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ini in configs/*.ini; do
  # Each block as: "CMD<TAB>args", then "LINE<TAB>text" per quoted line.
  while IFS=$'\t' read -r kind text; do
    if [[ $kind == CMD ]]; then
      blocks=$((blocks + 1))
      read -ra args <<<"$text"
      cmd="build/gtrain --plan $text"
      if ! "$gtrain" --plan "${args[@]}" 2>&1 | norm >"$out"; then
        echo "FAIL $ini: \`$cmd\` failed:" >&2; cat "$out" >&2; bad=1
      fi
      line_no=0 shown=0
      continue
    fi
    want=$(printf '%s\n' "$text" | norm)
    [[ $want == "..." ]] && continue
    # the first output line after the previous match that equals this one
    found=$(awk -v from="$line_no" -v want="$want" 'NR > from && $0 == want { print NR; exit }' "$out")
    if [[ -z $found ]]; then
      echo "FAIL $ini: \`$cmd\` does not print (after its line $line_no):" >&2
      echo "    $want" >&2
      if ((!shown)); then echo "  it prints:" >&2; sed 's/^/    /' "$out" >&2; shown=1; fi
      bad=1
    else
      line_no=$found
    fi
  done < <(awk '
      /^;[[:space:]]+\$ build\/gtrain --plan / { sub(/^;[[:space:]]+\$ build\/gtrain --plan /, ""); print "CMD\t" $0; inb = 1; next }
      inb && /^;[[:space:]][[:space:]]+[^[:space:]]/ { sub(/^;/, ""); print "LINE\t" $0; next }
      { inb = 0 }' "$ini")
done
if ((blocks == 0)); then echo "FAIL: no config quotes --plan (the pattern above found nothing)" >&2; exit 1; fi
((bad == 0)) || exit 1
echo "ok: $blocks --plan excerpts in configs/*.ini match"
