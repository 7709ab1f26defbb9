# replaces: grid
# loses: test_grid_2d, test_transpose
# mistake: puts the rows along x and the columns along y, in the grid and in the kernel
def grid_2d(shape, block):
    """Blocks (along x = columns, along y = rows) covering a rows x cols array with blocks of block = (bx, by)."""
    rows, cols = shape
    bx, by = block
    return (rows + bx - 1) // bx, (cols + by - 1) // by


@cuda.jit
def transpose_kernel(a, out):
    """out[column, row] = a[row, column]: one thread per element of a (x over columns, y over rows)."""
    row = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    column = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if row < a.shape[0] and column < a.shape[1]:
        out[column, row] = a[row, column]


def transpose(a, block=(8, 8)):
    """a.T computed by transpose_kernel on a 2D grid of 2D blocks."""
    out = np.zeros((a.shape[1], a.shape[0]), dtype=a.dtype)
    transpose_kernel[grid_2d(a.shape, block), block](a, out)
    return out
