"""Lynxi Lyngor target: KA200 "apu" artifact trees (JSON manifests + npuc fp16 program) and a vendor delegate."""
