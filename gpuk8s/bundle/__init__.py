"""Air-gapped bundles (issue 44, docs/airgap.md): one zstd-compressed tar of everything a site's hosts need, with a
manifest of what it holds (every file's sha256 and size, the targets it covers). This package reads and checks
bundles; it trusts nothing in one until its manifest and every file's digest have been checked, and reads the
archive with bounds on names, sizes and counts (a bundle is a file someone handed over)."""
