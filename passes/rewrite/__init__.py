"""Graph rewrites on the float IR: canonicalization and the patterns it recognises, recurrent unrolling."""
