// HeraldAnalysis module (work in progress).
