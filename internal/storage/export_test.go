package storage

// Publish builds and publishes a snapshot, as the loop does after its work;
// only for a reconciler whose Run has returned.
func Publish(r *Reconciler) { r.publish() }
