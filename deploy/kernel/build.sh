#!/usr/bin/env bash
# Builds warren's guest kernel (deploy/kernel/warren.config) from Debian's
# linux-source-6.1 package, and prints the path of the kernel it built.
# With --up it builds the uniprocessor variant (warren.config with
# up.config over it: CONFIG_SMP off, release *-warren-up) that one-vCPU
# guests run: `warren image build --kernel-up`.
# Next to it, modules/ holds the kernel's modules.builtin and an empty
# modules.dep, for `warren image build --modules`: every driver the guest
# needs is built in.
#
#   deploy/kernel/build.sh [--up] [OUT]      (OUT defaults to build/kernel)
#
# A build is kept under OUT by the hash of the config, this script and the
# source package, so running it again prints the same kernel at once.
# Progress goes to stderr; the compiler's output to OUT/build.log.
# Needs: apt-get install linux-source-6.1 bc bison flex libelf-dev gcc make
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
variant=
if [ "${1:-}" = --up ]; then
	variant=up
	shift
fi
out=${1:-build/kernel}
src=${WARREN_KERNEL_SOURCE:-/usr/src/linux-source-6.1.tar.xz}
say() { echo "kernel: $*" >&2; }

if [ ! -f "$src" ]; then
	say "$src is missing: apt-get install linux-source-6.1 bc bison flex libelf-dev"
	exit 1
fi
for tool in gcc make bc bison flex; do
	command -v "$tool" >/dev/null || { say "$tool is missing: apt-get install linux-source-6.1 bc bison flex libelf-dev"; exit 1; }
done
[ -f /usr/include/gelf.h ] || { say "libelf's headers are missing: apt-get install libelf-dev"; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
mkdir -p "$out/.fragments"
fragment=$(mktemp "$out/.fragments/XXXXXX")
trap 'rm -f "$fragment"' EXIT
if [ -n "$variant" ]; then
	# warren.config without the options $variant.config sets, then those.
	names=$(grep -oE 'CONFIG_[A-Z0-9_]+' "$here/$variant.config" | sort -u)
	grep -vwF -f <(echo "$names") "$here/warren.config" >"$fragment" || true
	cat "$here/$variant.config" >>"$fragment"
else
	cp "$here/warren.config" "$fragment"
fi
key=$( { cat "$fragment" "$here/build.sh"; stat -c '%n %s %Y' "$src"; } | sha256sum | cut -c1-16)
dest="$out/$key"
if ls "$dest"/vmlinuz-* >/dev/null 2>&1; then
	say "up to date: $(ls "$dest"/vmlinuz-*)"
	ls "$dest"/vmlinuz-*
	exit 0
fi

tree="$out/src-$key"
rm -rf "$tree" "$out"/src-*
mkdir -p "$tree"
say "unpacking $src"
tar -xf "$src" -C "$tree" --strip-components=1
cd "$tree"
say "configuring: allnoconfig + $here/warren.config${variant:+ + $variant.config}"
make -s allnoconfig KCONFIG_ALLCONFIG="$fragment" >"$out/build.log" 2>&1
# Kconfig drops an option whose dependencies are unmet without a word.
missing=0
while IFS= read -r opt; do
	if ! grep -qx "$opt" .config; then
		say "option not in the result: $opt (a dependency is missing from warren.config)"
		missing=1
	fi
done < <(grep -E '^CONFIG_[A-Z0-9_]+=' "$fragment")
while IFS= read -r opt; do
	if grep -q "^$opt=" .config; then
		say "option still set: $opt (something in warren.config selects it)"
		missing=1
	fi
done < <(sed -nE 's/^# (CONFIG_[A-Z0-9_]+) is not set$/\1/p' "$fragment")
[ "$missing" = 0 ] || exit 1

jobs=$(nproc)
say "compiling with $jobs jobs (about 9 minutes on 2 cores; log: $out/build.log)"
start=$(date +%s)
set +e
make -j"$jobs" bzImage 2>&1 | tee -a "$out/build.log" | awk '
	/^  CC / { n++; if (n % 200 == 0) { printf "kernel:   %d files compiled\n", n > "/dev/stderr"; fflush("/dev/stderr") } }'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then
	say "make failed ($rc); the end of $out/build.log:"
	tail -20 "$out/build.log" >&2
	exit 1
fi
release=$(make -s kernelrelease)
mkdir -p "$dest.tmp/modules/$release"
cp arch/x86/boot/bzImage "$dest.tmp/vmlinuz-$release"
cp modules.builtin "$dest.tmp/modules/$release/modules.builtin"
: >"$dest.tmp/modules/$release/modules.dep"
cp .config "$dest.tmp/config-$release"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
cd "$out"
rm -rf "$tree"
say "built $release in $(( $(date +%s) - start ))s: $dest/vmlinuz-$release"
echo "$dest/vmlinuz-$release"
