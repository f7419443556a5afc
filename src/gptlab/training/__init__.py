"""Training: the LightningModule (loss, optimizer, schedule) and the callbacks Lightning lacks."""
