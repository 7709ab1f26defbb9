# replaces: grid
# loses: test_transpose
# mistake: writes from every thread, also those past the edge of the array
def grid_2d(shape, block):
    """Blocks (along x = columns, along y = rows) covering a rows x cols array with blocks of block = (bx, by)."""
    rows, cols = shape
    bx, by = block
    return (cols + bx - 1) // bx, (rows + by - 1) // by


@cuda.jit
def transpose_kernel(a, out):
    """out[column, row] = a[row, column]: one thread per element of a (x over columns, y over rows)."""
    column = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    out[column, row] = a[row, column]


def transpose(a, block=(8, 8)):
    """a.T computed by transpose_kernel on a 2D grid of 2D blocks."""
    out = np.zeros((a.shape[1], a.shape[0]), dtype=a.dtype)
    transpose_kernel[grid_2d(a.shape, block), block](a, out)
    return out
