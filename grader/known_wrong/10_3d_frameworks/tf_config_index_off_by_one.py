# replaces: tf_mean_gradient
# loses: test_tf_mean_gradient
# mistake: numbers the workers from 1
# nightly: its grading restarts the TensorFlow workers; tf_sum_not_mean proves test_tf_mean_gradient on every push
def tf_config(addresses, index):
    """TF_CONFIG for worker `index` of a cluster of workers at `addresses`."""
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index + 1}}


def tf_mean_gradient(strategy, x, y, w):
    """In a TensorFlow worker: dL/dw of mean((x @ w - y)^2) on this worker's data, averaged over the workers."""
    import tensorflow as tf

    def replica_fn():
        weights = tf.constant(w)
        with tf.GradientTape() as tape:
            tape.watch(weights)
            loss = tf.reduce_mean((tf.matmul(tf.constant(x), weights) - tf.constant(y)) ** 2)
        grad = tape.gradient(loss, weights)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grad)

    @tf.function
    def step():
        return strategy.run(replica_fn)

    return strategy.experimental_local_results(step())[0].numpy()
