#!/bin/sh
# Put TriForce Chat in the desktop menu for this user (Linux, freedesktop.org desktops).
# Needs `triforce-chat` on PATH (pipx install . / uv tool install . / pip install --user .).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
install -Dm644 "$here/resources/triforce-chat.desktop" "$data/applications/triforce-chat.desktop"
install -Dm644 "$here/resources/icons/triforce-chat.svg" "$data/icons/hicolor/scalable/apps/triforce-chat.svg"
install -Dm644 "$here/resources/icons/triforce-chat.png" "$data/icons/hicolor/256x256/apps/triforce-chat.png"
command -v update-desktop-database >/dev/null && update-desktop-database "$data/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q "$data/icons/hicolor" || true
echo "Installed. TriForce Chat is in your applications menu; files dropped on its icon open in a new chat."
