def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n


if __name__ == "__main__":
    print(fibonacci(10))
