// HeraldSensor module (work in progress).
