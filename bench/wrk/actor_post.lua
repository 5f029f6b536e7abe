-- POST to the URL's path (one hot actor: every request hits the same one).
wrk.method = "POST"
