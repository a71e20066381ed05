"""Sophgo/Cvitek CV18xx target: the .cvimodel container, the TPU instruction codec and inspection."""
