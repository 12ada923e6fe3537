// HeraldCore module (work in progress).
