"""What users look at instead of read: contact sheets of frames (``hframe sheet``) and the
verify report as a page (``verify --html``)."""
