"""Looking at the host: doctor, metrics, warm, device discovery."""
