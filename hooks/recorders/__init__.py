"""What ``import hooks`` installs: wrappers of private TensorFlow functions that record names and
change nothing else: the gradients of every ``tf.gradients`` (``gradients``), the loss behind a
TF1 loss-scale optimizer (``loss_scale``), an Estimator model_fn's labels and loss
(``estimator``), how each wraps (``patching``); ``shared_gradients`` (``hooks.minimize``); and
``loss_and_labels``: which loss and labels the hook takes, from what they recorded.
"""
