#!/bin/bash
# Install an OpenPGP public key as an apt keyring only when it is the expected key; runs on the managed host.
#
#     trust_key.sh SOURCE KEYRING FINGERPRINT [--check]
#
# SOURCE is the downloaded key (ASCII-armored, as NVIDIA publishes 3bf863cc.pub, or binary). gpg reads it
# (`gpg --show-keys --with-colons`, in a scratch home removed on exit: no keyring of root's is touched); it
# must hold exactly one primary key, whose fingerprint is FINGERPRINT (40 hex digits, spaces and case
# ignored). Anything else is refused with exit status 1, "refusing the key: ..." on stderr, and nothing
# written. KEYRING gets the key's binary packets (`gpg --dearmor`, the format apt's signed-by wants), written
# as KEYRING.partial and renamed, mode 0644, only when its content differs. --check writes nothing.
# Prints JSON: {"changed": bool, "fingerprint": "...", "keyring": "..."}.
set -euo pipefail
umask 022

if [ "$#" -lt 3 ] || [ "$#" -gt 4 ] || { [ "$#" = 4 ] && [ "$4" != --check ]; }; then
  sed -n '2,4p' "$0" >&2
  exit 2
fi
source=$1
keyring=$2
want=$(printf '%s' "$3" | tr -d ' ' | tr 'a-f' 'A-F')
check=${4:-}

refuse() {
  printf 'refusing the key: %s\n' "$*" >&2
  exit 1
}
answer() {
  printf '{"changed": %s, "fingerprint": "%s", "keyring": "%s"}\n' "$1" "$want" "$keyring"
  exit 0
}

[[ $want =~ ^[0-9A-F]{40}$ ]] || refuse "the expected fingerprint '$3' is not 40 hexadecimal digits"
if [ ! -f "$source" ]; then
  # --check on a fresh host: the key has not been downloaded.
  [ -n "$check" ] && answer true
  refuse "$source does not exist"
fi
if ! command -v gpg >/dev/null 2>&1; then
  # --check on a host without gpg yet (the role installs it first).
  [ -n "$check" ] && answer true
  refuse "gpg is not installed (the package gpg)"
fi

home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
gpg_=(gpg --batch --quiet --no-options --no-autostart --homedir "$home")
if ! listing=$("${gpg_[@]}" --with-colons --fixed-list-mode --show-keys "$source" 2>"$home/errors"); then
  refuse "gpg cannot read $source as an OpenPGP key: $(tr '\n' ' ' <"$home/errors")"
fi
# The fingerprint of a primary key is the fpr record right after its pub record.
found=$(awk -F: '$1 == "pub" {primary = 1; next} primary && $1 == "fpr" {print $10; primary = 0}' <<<"$listing")
if [ "$found" != "$want" ]; then
  refuse "$source holds the key(s) $(printf '%s' "${found:-(none)}" | paste -sd, - | sed 's/,/, /g');" \
    "expected exactly the one with fingerprint $want"
fi

# An OpenPGP packet's first byte has its high bit set: a binary key is the keyring already.
if [ "$(od -An -tu1 -N1 "$source" | tr -d ' ')" -ge 128 ]; then
  cp "$source" "$home/keyring"
else
  "${gpg_[@]}" --dearmor --output "$home/keyring" "$source" 2>"$home/errors" ||
    refuse "gpg cannot dearmor $source: $(tr '\n' ' ' <"$home/errors")"
fi
if [ -f "$keyring" ] && cmp -s "$home/keyring" "$keyring"; then
  answer false
fi
if [ -z "$check" ]; then
  install -m 0644 "$home/keyring" "$keyring.partial"
  mv -f "$keyring.partial" "$keyring"
fi
answer true
