"""What each session sees and how people steer their own session (issue 20)."""
