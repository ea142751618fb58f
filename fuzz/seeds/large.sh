#!/bin/sh
# Writes seeds as large as the limits the relay targets guard (too big to
# keep in git): bundles just under the 8 MiB body limit, frames at and just
# over the 3 MiB frame cap. Into DIR/relay_bundle and DIR/relay_frame
# (DIR: the first argument, default corpus). Run from fuzz/.
set -eu
MIB=1048576
BUNDLE=$((8 * MIB))
FRAME=$((3 * MIB))
DIR=${1:-corpus}
mkdir -p "$DIR/relay_bundle" "$DIR/relay_frame"
cd "$DIR"

# `n` copies of a string.
rep() { yes "$2" | head -n "$1" | tr -d '\n'; }

island='<script type=\"application/oqse-manifest+json\">{\"appName\":\"Deep\"}</script>'
# HTML nested as deep as the body allows, the manifest after it: the
# quadratic case of a tree builder.
{
  printf '{"pluginHtml":"'
  rep $(((BUNDLE - 200) / 5)) '<div>'
  printf '%s","set":{}}' "$island"
} > relay_bundle/large-nested-div.json
# Unclosed formatting elements: the adoption agency's worst case.
{
  printf '{"pluginHtml":"'
  rep $(((BUNDLE - 200) / 3)) '<b>'
  printf '%s","set":{}}' "$island"
} > relay_bundle/large-b.json
# A string of escapes, decoded before the HTML is read.
{
  printf '{"pluginHtml":"%s' "$island"
  rep $(((BUNDLE - 200) / 6)) '\u00e9'
  printf '","set":{}}'
} > relay_bundle/large-escapes.json
# A set nested deeper than the JSON parser's recursion limit.
{
  printf '{"pluginHtml":"%s","set":' "$island"
  rep $(((BUNDLE - 200) / 5)) '{"a":'
  printf '1}'
} > relay_bundle/large-deep-set.json

# One `to` frame of exactly the cap, one a byte over it.
for size in $FRAME $((FRAME + 1)); do
  {
    printf '{"t":"to","to":"p-1","data":"'
    head -c $((size - 31)) /dev/zero | tr '\0' 'x'
    printf '"}'
  } > relay_frame/large-to-$size
done
# The cap filled with small frames, one a line.
yes '{"t":"up","data":[1]}' | head -n $((FRAME / 22)) > relay_frame/large-many-lines
# Data nested deep within the cap.
{
  printf '{"t":"up","data":'
  rep $((FRAME / 2 - 20)) '['
  rep $((FRAME / 2 - 20)) ']'
  printf '}'
} > relay_frame/large-deep-data
ls -l relay_bundle/large-* relay_frame/large-*
