"""What users look at instead of read: contact sheets of frames (``hframe sheet``)."""
