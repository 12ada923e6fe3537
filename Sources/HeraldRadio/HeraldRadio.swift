// HeraldRadio module (work in progress).
