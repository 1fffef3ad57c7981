// Package image builds guest templates (`warren image build`, `make
// image`): the PVH kernel uncompressed from the host's Debian kernel, an
// initramfs with warren-guest as /init and the virtio and ext4 modules it
// loads, and an ext4 root file system made with debootstrap. The result is
// a content-addressed template directory (see guest.Manifest).
//
// image uses guest (the manifest); the smoke boot comes in as a function
// (microvm.SmokeBoot), and nothing imports image but cmd/warren.
package image
