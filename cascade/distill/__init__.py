"""On-policy distillation: the student's samples, a teacher's view of them, one object per loss mode."""
